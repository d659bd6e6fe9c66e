"""Bounded dynamic shapes: torch_tpu.mark_dynamic pads a dim to a bucket, and ops
over padded tensors compile one program per bucket, not one per size.

Every test compares with CPU PyTorch for sizes 1..bound, bucket edges included,
and checks through the metrics that the ops ran padded (bounded_ops,
bounded_exact::<op> for an op that read exact shapes, bucket_compiles).
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu

BOUND = 32
SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32]  # buckets 1, 2, 4, 8, 16, 32
BUCKETS = 6


def marked(x: torch.Tensor, dim: int = 1, bound: int = BOUND) -> torch.Tensor:
    return torch_tpu.mark_dynamic(x.to("tpu"), dim, max=bound)


def exact_ops() -> dict:
    return {k: v for k, v in torch_tpu.metrics().items() if k.startswith("bounded_exact::")}


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5):
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a.cpu(), b, atol=tol, rtol=tol)


H = 6
W = torch.randn(H, 5)
B3 = torch.randn(H)
# Each family: a function of x [3, n, H] (float32), run on tpu with dim 1 bounded and on CPU.
FAMILIES = {
    "unary": lambda x: torch.exp(x).tanh() + F.gelu(x) + x.relu(),
    "binary_broadcast": lambda x: x * B3.to(x.device) - x / 2 + torch.maximum(x, x.new_zeros(1)),
    "compare_where": lambda x: torch.where(x > 0, x, -x) + (x >= 0.5).float(),
    "promotion": lambda x: (x.to(torch.bfloat16) * 3).float() + x.double().float(),
    "sum_bounded_dim": lambda x: x.sum(1),
    "sum_static_dim": lambda x: x.sum(-1, keepdim=True),
    "sum_all": lambda x: x.sum(),
    "mean": lambda x: x.mean(1) + x.mean(),
    "amax_amin": lambda x: x.amax(1) - x.amin(1),
    "softmax_bounded_dim": lambda x: torch.softmax(x, dim=1) + F.log_softmax(x, dim=1),
    "softmax_static_dim": lambda x: torch.softmax(x, dim=-1),
    "matmul_rows": lambda x: x @ W.to(x.device),
    "linear": lambda x: F.linear(x, W.t().contiguous().to(x.device), B3[:5].to(x.device)),
    "matmul_contracting": lambda x: x.transpose(1, 2) @ x,
    "attention": lambda x: torch.softmax(x @ x.transpose(1, 2), -1) @ x,
    "layer_norm": lambda x: F.layer_norm(x, (H,)),
    "views": lambda x: x.reshape(3 * x.shape[1], H).t().contiguous().view(H, 3, -1).sum(-1),
    "in_place": lambda x: x.clone().mul_(2).add_(1),
    "more_reductions": lambda x: (
        x.prod(1) + x.logsumexp(1) + x.max() - x.min() + (x > 0).any(1).float() + (x > -2).all(1).float()
    ),
    "positions": lambda x: x.max(1).values + x.min(1).indices.float() + x.argmax(1).float() - x.argmin(1).float(),
    "cumulative": lambda x: x.cumsum(1) + (x * 0.5).cumprod(1),
    # A box (a slice of the static head dim) of a transposed view: outputs laid out as PyTorch lays them out.
    "rotate_half_of_heads": lambda x: (lambda q: torch.cat((-q[..., 1:], q[..., :1]), -1) * q.exp())(
        x.view(3, x.shape[1], 2, 3).transpose(1, 2)
    ),
    "isin": lambda x: torch.isin((x * 2).round(), torch.tensor([0.0, 1.0], device=x.device)).float() + x,
    "triangular": lambda x: (x @ x.transpose(1, 2)).triu(1) - (x @ x.transpose(1, 2)).tril(),
    # A static buffer written at positions 0..n-1 (a static KV cache's index_copy_ at cache_position):
    # the padded positions point past the buffer, where the scatter skips them.
    "index_copy_into_a_static_buffer": lambda x: torch.zeros(3, BOUND + 3, H, device=x.device).index_copy_(
        1, torch.ones_like(x[0, :, 0], dtype=torch.long).cumsum(0) - 1, x * 2
    ),
    # An index into the bounded dim (the last token's logits): read at a runtime offset.
    "last_position": lambda x: x[:, -1] * 2 + x[:, -1:].sum(1) + x[:, 0].exp(),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_over_a_bounded_dim_matches_cpu_and_compiles_per_bucket(family):
    f = FAMILIES[family]
    torch.manual_seed(0)
    torch_tpu.reset_metrics()
    for n in SIZES:
        x = torch.randn(3, n, H)
        close(f(marked(x)), f(x), 1e-2 if family == "promotion" else 1e-5)
    m = torch_tpu.metrics()
    assert exact_ops() == {}, "ops that left the padded path"
    assert m.get("bounded_ops", 0) > 0 and m.get("bounded_unpads", 0) == 0
    # New sizes in buckets already seen build no program.
    for n in [6, 10, 12, 20, 30]:
        x = torch.randn(3, n, H)
        close(f(marked(x)), f(x), 1e-2 if family == "promotion" else 1e-5)
    assert torch_tpu.metrics()["bucket_compiles"] == m["bucket_compiles"]


def test_the_last_position_of_a_bounded_dim_builds_no_program_per_size():
    f = FAMILIES["last_position"]
    for n in [5, 7]:  # bucket 8
        f(marked(torch.randn(3, n, H)))
    torch.tpu.synchronize()
    before = torch_tpu.metrics()["cached_programs"]
    for n in [6, 8]:
        x = torch.randn(3, n, H)
        close(f(marked(x)), f(x))
        close(marked(x)[:, -1].clone(), x[:, -1].clone())
        close(marked(x)[:, -1].float(), x[:, -1])
    assert torch_tpu.metrics()["cached_programs"] - before <= 2  # the clone's and the copy's first


def causal_block(x):
    """Attention over x [2, n, 8] with positions and a causal mask made from x.shape[1], as models build them."""
    n = x.shape[1]
    pos = torch.arange(n, device=x.device)
    mask = torch.full((n, n), float("-inf"), device=x.device).triu(1)
    scores = x @ x.transpose(1, 2) / 3 + mask
    return torch.softmax(scores, -1) @ x + pos[None, :, None] * 0.1 + torch.ones(n, 1, device=x.device)


# Sizes that are not a power of two: a factory of a power-of-two size is not
# bounded (too often a static size, such as head_dim 8), and reads exact shapes.
UNEVEN = [3, 5, 6, 7, 9, 12, 15, 17, 20, 31]


def test_factories_of_a_bounded_size_come_out_padded():
    """arange, full, ones of a marked dim's real size are padded to its bucket:
    the positions and masks built from x.shape keep the ops on the padded path."""
    torch.manual_seed(0)
    torch_tpu.reset_metrics()
    for n in UNEVEN:
        x = torch.randn(2, n, 8)
        close(causal_block(marked(x)), causal_block(x))
    m = torch_tpu.metrics()
    assert exact_ops() == {}, "ops that left the padded path"
    assert m["padded_factories"] == 3 * len(UNEVEN), m
    for n in [10, 11, 13, 25, 30]:  # seen buckets: no program
        x = torch.randn(2, n, 8)
        close(causal_block(marked(x)), causal_block(x))
    assert torch_tpu.metrics()["bucket_compiles"] == m["bucket_compiles"]
    for n in [1, 2, 4, 8, 16, 32]:  # plain factories: exact, and right
        x = torch.randn(2, n, 8)
        close(causal_block(marked(x)), causal_block(x))


def test_a_pointwise_output_of_a_padded_view_has_cpu_strides_in_size_one_dims():
    """TensorIterator places a size-1 dim by its stride: bitwise_not of
    x.unfold(0, 2, 3)[:1] keeps the input's stride 6 there (found by the random
    programs under TORCH_TPU_DYNAMIC=auto), and x * 2 of that lays it out again."""
    for n, dim in [(3, 1), (5, 0)]:
        x = torch.tensor([[2, -6], [-6, 1], [-3, 4], [5, 7], [0, 9]][:n])
        box = x.unfold(0, 2, 3)[:1]
        padded_box = marked(x.to("tpu"), dim).unfold(0, 2, 3)[:1]
        for f in (torch.bitwise_not, lambda t: torch.bitwise_not(t) * 2, lambda t: torch.bitwise_not(t).add_(1)):
            want, got = f(box), f(padded_box)
            assert torch.equal(got.cpu(), want) and got.stride() == want.stride(), (n, dim, got.stride(), want.stride())
    # masked_fill is a contiguous clone on CPU, whatever its inputs' order (seed 0, program 91 under auto).
    mask, x = torch.tensor([True, False, True, False]), torch.tensor([[-2.25, 2.25, -1.0, 0.25]])
    want = (x @ x.mT).masked_fill(mask.unfold(0, 4, 1), -2)
    tx = marked(x.to("tpu"))
    got = (tx @ tx.mT).masked_fill(marked(mask.to("tpu"), 0).unfold(0, 4, 1), -2)
    assert torch.equal(got.cpu(), want) and got.stride() == want.stride() == (4, 1), got.stride()


FACTORIES = """
import torch, torch_tpu
ids = torch_tpu.mark_dynamic(torch.zeros(1, 11, dtype=torch.long, device="tpu"), 1, max=64)
mask = torch.full((11, 11), float("-inf"), device="tpu").triu(1)
pos, other = torch.arange(11, device="tpu"), torch.ones(1, 13, device="tpu")
assert [torch_tpu._C._padded_shape(t) for t in (mask, pos, other)] == [[16, 16], [16], None]
assert torch.equal(mask.cpu(), torch.full((11, 11), float("-inf")).triu(1)) and pos.tolist() == list(range(11))
p = torch.nn.init.ones_(torch.nn.Parameter(torch.empty(11, 4, device="tpu")))  # a parameter's init: plain
assert torch_tpu._C._padded_shape(p) is None and torch_tpu.metrics()["padded_factories"] == 2
buf = torch.zeros(20, dtype=torch.long, device="tpu")
torch.arange(11, out=buf[:11])  # out= a view of a larger storage: written exactly
assert buf.tolist() == list(range(11)) + [0] * 9 and torch_tpu._C._padded_shape(buf) is None
torch.use_deterministic_algorithms(True)  # new memory filled: empty calls fill_, which must not pad again
ones, steps = torch.ones(11, device="tpu"), torch.arange(11, device="tpu")
assert ones.tolist() == [1.0] * 11 and steps.tolist() == list(range(11))
assert torch_tpu._C._padded_shape(ones) == [16] and torch_tpu._C._padded_shape(steps) == [16]
torch.use_deterministic_algorithms(False)
del ids, mask, pos, ones, steps
assert torch_tpu._C._padded_shape(torch.arange(11, device="tpu")) is None  # no padded tensor lives
print("ok")
"""


def test_a_factory_is_bounded_only_while_a_padded_tensor_of_its_size_lives():
    run_with("marked", FACTORIES)


def test_causal_attention_over_a_bounded_sequence_matches_cpu_per_bucket():
    torch.manual_seed(0)
    torch_tpu.reset_metrics()
    for n in UNEVEN:
        q, k, v = (torch.randn(1, 2, n, 8) for _ in range(3))
        for causal in (True, False):
            got = F.scaled_dot_product_attention(marked(q, 2), marked(k, 2), marked(v, 2), is_causal=causal)
            close(got, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    assert exact_ops() == {}
    before = torch_tpu.metrics()["bucket_compiles"]
    for n in [10, 13, 25]:
        q = torch.randn(1, 2, n, 8)
        got = F.scaled_dot_product_attention(*(marked(q, 2),) * 3, is_causal=True)
        close(got, F.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert torch_tpu.metrics()["bucket_compiles"] == before


def test_safe_softmax_gives_zero_rows_for_rows_of_only_minus_infinity():
    x = torch.randn(3, 4, 5)
    x[1, 2] = float("-inf")
    x[0, 1, :3] = float("-inf")
    for dim, dtype in ((-1, None), (1, torch.float64), (0, None)):
        close(torch.ops.aten._safe_softmax(x.to("tpu"), dim, dtype), torch.ops.aten._safe_softmax(x, dim, dtype))
    t = marked(x, 2, 8)
    close(torch.ops.aten._safe_softmax(t, -1), torch.ops.aten._safe_softmax(x, -1))


class Tiny(nn.Module):
    def __init__(self, vocab=40, hidden=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids):
        x = self.ln(self.emb(ids))
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(1, 2) / 4, dim=-1)
        return self.out(F.gelu(a @ v) + x)


def test_a_training_step_over_bounded_token_ids_matches_cpu_and_stays_padded():
    torch.manual_seed(0)
    cpu = Tiny()
    tpu = Tiny().to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    torch_tpu.reset_metrics()
    for n in [3, 9, 16, 5]:
        ids = torch.randint(0, 40, (2, n))
        labels = torch.randint(0, 40, (2, n))
        ref = F.cross_entropy(cpu(ids).reshape(-1, 40), labels.reshape(-1))
        ref.backward()
        got = F.cross_entropy(tpu(marked(ids)).reshape(-1, 40), marked(labels).reshape(-1))
        got.backward()
        close(got.detach(), ref.detach(), 1e-5)
        for p, q in zip(tpu.parameters(), cpu.parameters(), strict=True):
            close(p.grad, q.grad, 1e-4)
    assert exact_ops() == {}
    assert torch_tpu.metrics()["bounded_ops"] > 50


def test_a_bounded_loop_in_fused_mode_compiles_one_window_per_bucket():
    def step(x):
        return (torch.softmax(x * 2, dim=1) * x).sum(1)

    with torch_tpu.set_eager_mode("fused"):
        torch_tpu.reset_metrics()
        for n in [17, 20, 25, 31, 32, 18, 3, 4]:  # buckets 32 and 4
            x = torch.randn(2, n, 4)
            close(step(marked(x)), step(x))
        m = torch_tpu.metrics()
    assert m["fused_window_compiles"] <= 2 + 2, m  # a window per bucket (and its flush shape)
    assert exact_ops() == {}


def test_ops_without_a_bounded_rule_read_the_real_elements():
    torch.manual_seed(0)
    torch_tpu.reset_metrics()
    for n in [3, 6]:
        x = torch.randn(2, n)
        t = marked(x)
        close(t.flip(1), x.flip(1))
        close(torch.sort(t, 1).values, torch.sort(x, 1).values)
        close(t[:, 1:] * 2, x[:, 1:] * 2)  # a view that is not the whole storage
    assert exact_ops()  # named in the metrics
    assert torch_tpu.metrics()["bounded_unpads"] > 0


def test_writes_into_a_padded_tensor_and_host_reads():
    x = torch.arange(12.0).view(2, 6)
    t = marked(x)
    assert torch_tpu._C._padded_shape(t) == [2, 8]
    assert t.shape == (2, 6) and t.tolist() == x.tolist()
    assert "tpu" in repr(t) and "11." in repr(t) and "0., 0." not in repr(t)[len("tensor([[0., 1.") :]
    t[:, 0] = -1.0  # a partial write: the storage becomes plain, every element kept
    x[:, 0] = -1.0
    assert t.tolist() == x.tolist() and torch_tpu._C._padded_shape(t) is None
    u = marked(x.clone())
    u.copy_(torch.ones(2, 6))  # a whole write replaces the padded value
    assert u.cpu().tolist() == torch.ones(2, 6).tolist()
    assert t.sum().item() == x.sum().item()
    # An in-place op reading part of itself raises as on CPU (seed 1, program 1090 under auto).
    v = marked(torch.tensor([[-1.25], [-1.25], [1.25]]), 0)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        v.sub_(v.select(0, -2))
    assert v.cpu().tolist() == [[-1.25], [-1.25], [1.25]]


def test_debug_nan_check_sees_only_real_elements():
    x = torch.rand(2, 5) + 0.5
    with torch_tpu.set_eager_mode("debug", check_nan=True):
        t = marked(x)
        close(torch.log(t), torch.log(x))  # the padding (zeros) would be -inf
        with pytest.raises(RuntimeError, match="NaN or Inf"):
            torch.log(t - t).sum().item()


def test_mark_dynamic_refuses_bad_input():
    t = torch.zeros(2, 40, device="tpu")
    with pytest.raises(
        RuntimeError, match=r"dim 1 of the tensor of shape \[2, 40\] has size 40, above its declared bound max=32"
    ):
        torch_tpu.mark_dynamic(t, 1, max=32)
    with pytest.raises(RuntimeError, match="expected a tpu tensor, got one on cpu"):
        torch_tpu.mark_dynamic(torch.zeros(2, 3), 1, max=8)
    with pytest.raises(IndexError, match="dim 2 is out of range for a tensor of shape"):
        torch_tpu.mark_dynamic(t, 2, max=64)
    with pytest.raises(RuntimeError, match="view of a larger storage"):
        torch_tpu.mark_dynamic(t[:, :5], 1, max=64)
    assert t.sum().item() == 0  # the process stays usable


def cross_entropy_of(model, a, b):
    return F.cross_entropy(model(a).reshape(-1, 40), b.reshape(-1))


def train_over_lengths(lengths, loss_on_tpu):
    """AdamW steps of Tiny over token ids of each length, on CPU and (marked, bound 64) on tpu:
    the losses match at every step."""
    torch.manual_seed(0)
    cpu = Tiny()
    tpu = Tiny().to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_tpu = torch.optim.AdamW(tpu.parameters(), lr=1e-2)
    for n in lengths:
        ids = torch.randint(0, 40, (2, n + 1))
        x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        for model, opt, (a, b), loss_of in (
            (cpu, opt_cpu, (x, y), cross_entropy_of),
            (tpu, opt_tpu, (marked(x, bound=64), marked(y, bound=64)), loss_on_tpu),
        ):
            loss = loss_of(model, a, b)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if model is cpu:
                expected = loss.item()
        torch.testing.assert_close(loss.item(), expected, atol=1e-4, rtol=1e-4)


def test_a_fused_training_loop_over_random_lengths_compiles_a_window_per_bucket():
    lengths = torch.randint(1, 65, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch_tpu.set_eager_mode("fused"):
        torch_tpu.reset_metrics()
        train_over_lengths(lengths, cross_entropy_of)
        m = torch_tpu.metrics()
    assert len({(n - 1).bit_length() for n in lengths}) <= 7  # buckets of 1..64
    assert m["fused_window_compiles"] <= 10, m["fused_window_compiles"]
    assert exact_ops() == {}


def test_a_compiled_training_loop_over_random_lengths_compiles_a_graph_program_per_bucket():
    # Dynamo's graph turns symbolic at the second length (automatic dynamic shapes): from then on
    # it runs over bounded shapes, one window per bucket for the forward and one for the backward.
    torch._dynamo.reset()
    lengths = torch.randint(2, 65, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    torch_tpu.reset_metrics()
    train_over_lengths(lengths, torch.compile(cross_entropy_of, backend="tpu"))
    m = torch_tpu.metrics()
    buckets = {(n - 1).bit_length() for n in lengths[1:]}  # the first length: a static graph
    bounded = [k for k in m["graph_compile_ms"] if " bounded " in k]
    assert len(bounded) == 2 * len(buckets), sorted(m["graph_compile_ms"])
    assert m["recompiles"] == 1, m["recompile_reasons"]
    assert exact_ops() == {}
    torch._dynamo.reset()


def test_a_compiled_graph_makes_its_masks_and_positions_padded():
    # Factories of a symbolic size (a causal mask, positions) are made at the bucket, padded.
    def f(q, k, v, w):
        n = q.shape[1]
        mask = torch.full((n, n), float("-inf"), device=q.device).triu(1)
        pos = torch.arange(n, device=q.device).float()
        o = torch.softmax(q @ k.transpose(-1, -2) / 4 + mask, -1) @ v + pos[None, :, None] * w
        return o.sum(1), F.layer_norm(o, (8,)).mean(), o.cumsum(1)[:, -1], o.max(dim=1).values

    torch._dynamo.reset()
    g = torch.compile(f, backend="tpu", dynamic=True)
    w = torch.randn(8)
    torch_tpu.reset_metrics()
    for n in (3, 5, 7, 11, 13, 6):  # buckets 4, 8, 16
        q, k, v = (torch.randn(2, n, 8) for _ in range(3))
        for got, want in zip(g(*(t.to("tpu") for t in (q, k, v, w))), f(q, k, v, w), strict=True):
            close(got, want, 1e-4)
    m = torch_tpu.metrics()
    assert len([k for k in m["graph_compile_ms"] if " bounded " in k]) == 3
    assert exact_ops() == {}
    torch._dynamo.reset()


AUTO = """
import warnings
import torch, torch_tpu
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 64), torch.nn.Linear(64, 8)).to("tpu")
assert torch_tpu.metrics().get("dynamic_dims", 0) == 0  # parameters copied in a burst of shapes: not one varying dim
cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 64), torch.nn.Linear(64, 8))
model.load_state_dict(cpu_model.state_dict())  # copies into tpu parameters: not bounded either
assert torch_tpu.metrics().get("dynamic_dims", 0) == 0 and all(
    torch_tpu._C._padded_shape(p) is None for p in model.parameters()
)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = [torch.randn(13, n, dtype=torch.float64).to("tpu") for n in (5, 9, 17, 20)]
assert [torch_tpu._C._padded_shape(t) for t in first] == [None, None, [13, 32], [13, 32]]
messages = [str(w.message) for w in caught if "copied to tpu" in str(w.message)]
assert len(messages) == 1 and "dim 1 of float64[13, *] tensors copied to tpu took 3 sizes (5,9,17)" in messages[0]
m = torch_tpu.metrics()
assert m["dynamic_dims"] == 1 and m["dynamic_dim::copy float64[13, *] dim 1"] == 1
before = m.get("bucket_compiles", 0)
for n in (18, 25, 31, 33, 40, 64):  # buckets 32 and 64
    x = torch.randn(13, n, dtype=torch.float64)
    torch.testing.assert_close((x.to("tpu").exp() * 2).sum(1).cpu(), (x.exp() * 2).sum(1))
m = torch_tpu.metrics()
assert m["bucket_compiles"] - before <= 2 * 3, m  # exp, mul, sum per bucket
assert not [k for k in m if k.startswith("bounded_exact::")], m
print("ok")
"""


def run_with(setting: str | None, code: str) -> None:
    """`code` in a fresh process under TORCH_TPU_DYNAMIC=setting (None: unset, the default)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_TPU_DYNAMIC"}
    if setting is not None:
        env["TORCH_TPU_DYNAMIC"] = setting
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_auto_a_dim_that_took_three_sizes_in_copies_to_tpu_turns_bounded_with_one_warning():
    run_with("auto", AUTO)


def test_auto_is_the_default_and_marked_keeps_copies_exact():
    run_with(None, AUTO)
    code = (
        "import torch, torch_tpu\n"
        "ts = [torch.zeros(3, n).to('tpu') for n in (2, 3, 5, 7)]\n"
        "assert all(torch_tpu._C._padded_shape(x) is None for x in ts)\n"
        "assert 'dynamic_dims' not in torch_tpu.metrics()\n"
        "print('ok')\n"
    )
    run_with("marked", code)


def test_dynamic_off_keeps_exact_shapes():
    code = (
        "import torch, torch_tpu\n"
        "ts = [torch.zeros(3, n).to('tpu') for n in (2, 3, 5, 7)]\n"
        "t = torch_tpu.mark_dynamic(torch.zeros(3, 6, device='tpu'), 1, max=8)\n"
        "assert all(torch_tpu._C._padded_shape(x) is None for x in ts + [t])\n"
        "try:\n"
        "    torch_tpu.mark_dynamic(torch.zeros(3, 9, device='tpu'), 1, max=8)\n"
        "except RuntimeError as e:\n"
        "    assert 'above its declared bound max=8' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no error')\n"
        "print('ok')\n"
    )
    run_with("off", code)


def test_a_padded_tensor_behaves_as_its_real_elements_everywhere(tmp_path):
    import copy

    x = torch.arange(15.0).view(3, 5)
    t = marked(x)
    assert t.untyped_storage().nbytes() == 15 * 4
    assert t.t().cpu().tolist() == x.t().tolist()  # a transposed read, cut on the host
    assert t.t().contiguous().cpu().tolist() == x.t().contiguous().tolist()
    assert t.to(torch.float16).cpu().tolist() == x.to(torch.float16).tolist()
    assert t.view(torch.int32).cpu().tolist() == x.view(torch.int32).tolist()  # a reinterpreting view
    assert copy.deepcopy(t).cpu().tolist() == x.tolist()
    torch.save(t, tmp_path / "t.pt")
    assert torch.load(tmp_path / "t.pt").cpu().tolist() == x.tolist()
    u = marked(x.clone())
    u[1].add_(100)  # an in-place op on a view of a row
    y = x.clone()
    y[1].add_(100)
    assert u.cpu().tolist() == y.tolist()
    v = marked(x.clone())
    v.resize_(4, 5)  # grows as plain bytes, the old elements kept
    assert v[:3].cpu().tolist() == x.tolist()
    w = torch.empty(0, device="tpu").set_(t.untyped_storage(), 0, (5, 3), (3, 1))
    assert w.cpu().tolist() == x.view(5, 3).tolist()


def test_padded_and_plain_ops_share_a_fused_window():
    x = torch.randn(4, 6)
    z = torch.randn(4, 1)
    with torch_tpu.set_eager_mode("fused"):
        torch_tpu.reset_metrics()
        t = marked(x)
        out = (torch.softmax(t, 1) * z.to("tpu")).sum(1) + z.to("tpu").squeeze(1).exp()
        got = out.cpu()
        m = torch_tpu.metrics()
    close(got, (torch.softmax(x, 1) * z).sum(1) + z.squeeze(1).exp())
    assert m["fused_flushes"] == 1


def test_a_kv_cache_that_grows_along_its_bounded_dim_stays_padded():
    torch.manual_seed(0)
    torch_tpu.reset_metrics()
    ref = torch.randn(2, 3, 5, 4)
    cache = torch_tpu.mark_dynamic(ref.to("tpu"), 2, max=64)
    for _ in range(12):  # 6 .. 17 rows: buckets 8, 16, 32
        new, q = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
        cache, ref = torch.cat([cache, new.to("tpu")], dim=2), torch.cat([ref, new], dim=2)
        got = torch.softmax(q.to("tpu") @ cache.transpose(-1, -2), -1) @ cache
        close(cache, ref, 0)
        close(got, torch.softmax(q @ ref.transpose(-1, -2), -1) @ ref)
    assert torch_tpu._C._padded_shape(cache) == [2, 3, 32, 4]
    assert exact_ops() == {}
    # cat per (input bucket, output bucket): 8-8, 8-16, 16-16, 16-32; attention's 3 ops per bucket.
    assert torch_tpu.metrics()["bucket_compiles"] <= 4 + 3 * 3


def test_dropout_and_the_gradient_of_a_sum_stay_padded():
    torch.manual_seed(0)
    torch_tpu.reset_metrics()
    for n in [5, 7, 12]:
        x = torch.randn(3, n, 8) + 3
        t = marked(x).requires_grad_()
        y = F.dropout(t, 0.5, training=True)
        kept = y.detach().cpu() != 0
        assert 0.2 < kept.float().mean() < 0.8
        close(y.detach()[kept.to("tpu")], x[kept] * 2)
        y.sum().backward()  # sum's gradient: a plain 0-d tensor expanded along the bounded dim
        close(t.grad, kept.float() * 2)
        assert torch_tpu._C._padded_shape(y) is not None and torch_tpu._C._padded_shape(t.grad) is not None
    assert {k for k in exact_ops() if "dropout" in k or "mul" in k} == set()
