"""Device random numbers: the tpu generator (seeding, state, fork_rng) and the
random ops, checked for reproducibility and, with large samples, for their
distributions (moments within a few standard errors, Kolmogorov-Smirnov
bounds). Every draw runs with the CPU fallback off, so a test fails if an op
is not lowered."""

import math
import warnings

import pytest
import torch

import torch_tpu

D = "tpu"
N = 200_000  # sample size of the statistical checks


@pytest.fixture(autouse=True)
def no_fallback():
    with torch_tpu.set_fallback("error"):
        yield


def ks_distance(sample: torch.Tensor, cdf) -> float:
    """sup |F_n - F| of a 1-D sample against the CDF `cdf` (float64 on CPU)."""
    x, _ = sample.double().cpu().flatten().sort()
    n = x.numel()
    f = cdf(x)
    upper = torch.arange(1, n + 1, dtype=torch.float64) / n - f
    lower = f - torch.arange(0, n, dtype=torch.float64) / n
    return max(upper.max().item(), lower.max().item())


def normal_cdf(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


# The Kolmogorov statistic exceeds 2.0 / sqrt(n) with probability < 1e-3.
KS = 2.0 / math.sqrt(N)
GRID = {torch.float32: 2**-24, torch.float64: 2**-53, torch.bfloat16: 2**-8, torch.float16: 2**-11}


def assert_mean(x: torch.Tensor, mean: float, sd: float, k: float = 5.0):
    """The sample mean lies within k standard errors of `mean`."""
    m = x.double().mean().item()
    se = sd / math.sqrt(x.numel())
    assert abs(m - mean) < k * se, (m, mean, se)


# ------------------------------------------------------------------ the generator

DRAWS = {
    "rand": lambda g: torch.rand(64, device=D, generator=g),
    "randn": lambda g: torch.randn(64, device=D, generator=g),
    "randint": lambda g: torch.randint(0, 1000, (64,), device=D, generator=g),
    "randperm": lambda g: torch.randperm(64, device=D, generator=g),
    "normal_": lambda g: torch.empty(64, device=D).normal_(2, 3, generator=g),
    "exponential_": lambda g: torch.empty(64, device=D).exponential_(generator=g),
    "bernoulli": lambda g: torch.bernoulli(torch.full((64,), 0.5, device=D), generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(64, device=D), 64, generator=g),
}


@pytest.mark.parametrize("op", DRAWS)
def test_same_seed_same_numbers_other_seed_other_numbers(op):
    draw = DRAWS[op]
    g = torch.Generator(device=D)
    g.manual_seed(1234)
    a = draw(g).cpu()
    g.manual_seed(1234)
    b = draw(g).cpu()
    g.manual_seed(1235)
    c = draw(g).cpu()
    assert a.device.type == "cpu" and torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("op", DRAWS)
def test_default_generator_follows_torch_manual_seed(op):
    draw = DRAWS[op]
    torch.manual_seed(7)
    a, a2 = draw(None).cpu(), draw(None).cpu()
    torch.manual_seed(7)
    b, b2 = draw(None).cpu(), draw(None).cpu()
    assert torch.equal(a, b) and torch.equal(a2, b2)
    assert not torch.equal(a, a2)  # successive calls draw new numbers


def test_successive_calls_differ():
    torch.manual_seed(0)
    draws = [torch.rand(1000, device=D).cpu() for _ in range(5)]
    for i in range(5):
        for j in range(i + 1, 5):
            assert (draws[i] == draws[j]).float().mean() < 0.01


def test_device_module_seeding_api():
    torch.tpu.manual_seed(11)
    assert torch.tpu.initial_seed() == 11
    a = torch.rand(8, device=D).cpu()
    torch.tpu.manual_seed_all(11)
    assert torch.equal(torch.rand(8, device=D).cpu(), a)
    torch.tpu.seed()
    s = torch.tpu.initial_seed()
    assert s != 11
    torch.tpu.seed_all()
    assert torch.tpu.initial_seed() != s
    gens = torch.tpu.default_generators
    assert len(gens) == torch.tpu.device_count() and gens[0].device == torch.device("tpu", 0)
    assert gens[0] is torch.tpu.default_generators[0]
    torch.manual_seed(-5)  # negative seeds map as on CPU
    assert torch.tpu.initial_seed() == torch.initial_seed()


def test_explicit_generator_leaves_the_default_alone():
    torch.manual_seed(3)
    state = torch.tpu.get_rng_state()
    g1, g2 = torch.Generator(device=D), torch.Generator(device=D)
    g1.manual_seed(99)
    g2.manual_seed(99)
    assert g1.device == torch.device("tpu", 0)
    assert torch.equal(torch.randn(16, device=D, generator=g1).cpu(), torch.randn(16, device=D, generator=g2).cpu())
    assert torch.equal(torch.tpu.get_rng_state(), state)
    assert g1.get_offset() == 1


def test_rng_state_round_trip():
    g = torch.Generator(device=D).manual_seed(5)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    a = torch.rand(32, device=D, generator=g).cpu()
    g.set_state(state)
    assert torch.equal(torch.rand(32, device=D, generator=g).cpu(), a)
    torch.manual_seed(5)
    saved = torch.tpu.get_rng_state(0)
    b = torch.randn(32, device=D).cpu()
    torch.tpu.set_rng_state(saved, 0)
    assert torch.equal(torch.randn(32, device=D).cpu(), b)
    states = torch.tpu.get_rng_state_all()
    c = torch.randn(4, device=D).cpu()
    torch.tpu.set_rng_state_all(states)
    assert torch.equal(torch.randn(4, device=D).cpu(), c)
    with pytest.raises(RuntimeError, match="16 bytes"):
        g.set_state(torch.zeros(5, dtype=torch.uint8))


def test_fork_rng_restores_the_device_state():
    torch.manual_seed(8)
    before = torch.tpu.get_rng_state()
    with torch.random.fork_rng(devices=[0], device_type="tpu"):
        torch.manual_seed(100)
        torch.rand(10, device=D)
    assert torch.equal(torch.tpu.get_rng_state(), before)
    a = torch.rand(10, device=D).cpu()
    torch.manual_seed(8)
    assert torch.equal(torch.rand(10, device=D).cpu(), a)


def test_filling_a_fresh_tensor_uploads_only_the_key():
    torch.rand(1000, device=D).cpu()  # compiled
    torch_tpu.reset_metrics()
    torch.rand(1000, device=D)
    torch.empty(1000, device=D).normal_()
    m = torch_tpu.metrics()
    # A key each (and the Scalars that earlier tests made program inputs), never the tensor.
    assert m["transfers_to_device"] >= 2 and m["bytes_to_device"] <= 64, m


def test_a_cpu_generator_is_refused_with_a_clear_message():
    with pytest.raises(RuntimeError, match='expected a tpu generator.*torch.Generator\\(device="tpu"\\)'):
        torch.rand(3, device=D, generator=torch.Generator())


def test_random_ops_do_not_recompile_across_calls():
    x = torch.ones(100, device=D)
    torch.tpu.synchronize()  # Fused mode: x's own window apart from the first op's
    ops = [
        lambda: torch.rand(100, device=D),
        lambda: torch.randn(100, device=D),
        lambda: torch.randint(0, 7, (100,), device=D),
        lambda: torch.randperm(100, device=D),
        lambda: torch.bernoulli(x * 0.5),
        lambda: torch.nn.functional.dropout(x, 0.3, True),
        lambda: torch.multinomial(x, 10, replacement=True),
        lambda: torch.multinomial(x, 10),
        lambda: x.clone().exponential_(),
    ]
    for op in ops:
        op().cpu()  # compiled here at most
    compiles = torch_tpu.metrics()["compiles"]
    for _ in range(3):
        for op in ops:
            op().cpu()
    assert torch_tpu.metrics()["compiles"] == compiles


def test_seeding_before_the_first_tpu_op_does_not_start_the_runtime(run_python):
    r = run_python(
        "import torch, torch_tpu\n"
        "torch.manual_seed(21)\n"
        "print('started', torch_tpu._C._initialized())\n"
        "a = torch.rand(5, device='tpu').cpu()\n"
        "torch.tpu.manual_seed(21)\n"
        "print('same', torch.equal(torch.rand(5, device='tpu').cpu(), a))\n"
    )
    assert r.returncode == 0, r.stderr
    assert "started False" in r.stdout and "same True" in r.stdout


def test_ops_without_a_rule_take_the_tpu_generator_on_the_cpu_fallback():
    with torch_tpu.set_fallback("cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning
        rates = torch.full((1000,), 3.0, device=D)
        g = torch.Generator(device=D)
        a = torch.poisson(rates, generator=g.manual_seed(4)).cpu()
        b = torch.poisson(rates, generator=g.manual_seed(4)).cpu()
    assert torch.equal(a, b)
    assert abs(a.mean().item() - 3.0) < 5 * math.sqrt(3.0 / 1000)


# ------------------------------------------------------------------ distributions


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_rand_is_uniform_on_the_dtypes_grid(dtype):
    torch.manual_seed(1)
    x = torch.rand(N, device=D, dtype=dtype)
    assert x.dtype == dtype and x.shape == (N,)
    x = x.cpu().double()
    assert x.min() >= 0 and x.max() < 1
    assert torch.equal(x, torch.round(x / GRID[dtype]) * GRID[dtype])  # multiples of 2^-digits
    assert ks_distance(x, lambda t: t) < KS + GRID[dtype]
    assert_mean(x, 0.5, math.sqrt(1 / 12))


def test_uniform_in_a_range_and_through_views():
    torch.manual_seed(2)
    x = torch.empty(N, device=D).uniform_(-3, 5).cpu()
    assert x.min() >= -3 and x.max() < 5
    assert ks_distance(x, lambda t: (t + 3) / 8) < KS
    base = torch.zeros(4, 6, device=D)
    base[:, 1::2].uniform_(1, 2)
    b = base.cpu()
    assert (b[:, 0::2] == 0).all() and (b[:, 1::2] >= 1).all() and (b[:, 1::2] < 2).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_randn_is_standard_normal(dtype):
    torch.manual_seed(3)
    x = torch.randn(N, device=D, dtype=dtype)
    assert x.dtype == dtype
    x = x.cpu().double()
    assert_mean(x, 0, 1)
    assert abs(x.var().item() - 1) < 5 * math.sqrt(2 / N)
    grid = 2**-8 if dtype == torch.bfloat16 else 0  # bf16 rounding moves the CDF a little
    assert ks_distance(x, normal_cdf) < KS + 0.5 * grid * 4


def test_normal_with_tensor_parameters():
    torch.manual_seed(4)
    mean = torch.tensor([-10.0, 0.0, 10.0], device=D).repeat(N // 3)
    std = torch.tensor([1.0, 2.0, 0.5], device=D).repeat(N // 3)
    for x in [torch.normal(mean, std), torch.normal(mean, 2.0), torch.normal(1.0, std)]:
        assert x.shape == mean.shape
    x = torch.normal(mean, std).cpu().view(-1, 3)
    for k, (m, s) in enumerate([(-10, 1), (0, 2), (10, 0.5)]):
        assert_mean(x[:, k], m, s)
        assert abs(x[:, k].std().item() / s - 1) < 5 / math.sqrt(N / 3)
    y = torch.empty(N, device=D).normal_(5, 0.1).cpu()
    assert_mean(y, 5, 0.1)
    z = torch.normal(3.0, 2.0, (N,), device=D).cpu()
    assert ks_distance((z - 3) / 2, normal_cdf) < KS


def test_randint_in_range_with_even_frequencies():
    torch.manual_seed(5)
    x = torch.randint(-3, 7, (N,), device=D).cpu()
    assert x.dtype == torch.int64 and x.min() == -3 and x.max() == 6
    counts = torch.bincount(x + 3, minlength=10).double()
    expected = N / 10
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 40  # 9 degrees of freedom: P(chi2 > 40) < 1e-5
    for dtype, lo, hi in [(torch.uint8, 0, 256), (torch.int8, -128, 128), (torch.int32, -(2**31), 2**31 - 1)]:
        y = torch.randint(lo, hi, (N,), device=D, dtype=dtype).cpu()
        assert y.dtype == dtype
        y = y.long()
        assert y.min() >= lo and y.max() < hi
        assert_mean(y, (lo + hi - 1) / 2, (hi - lo) / math.sqrt(12))
    big = torch.randint(-(2**62), 2**62, (N,), device=D).cpu()
    assert big.min() >= -(2**62) and big.max() < 2**62
    assert (big < 0).float().mean().item() == pytest.approx(0.5, abs=0.01)


def test_random_fills_each_dtypes_range():
    torch.manual_seed(6)
    f = torch.empty(N, device=D).random_().cpu()
    assert f.min() >= 0 and f.max() <= 2**24 and torch.equal(f, f.round())
    assert_mean(f, 2**23, 2**24 / math.sqrt(12))
    b = torch.empty(N, device=D, dtype=torch.bool).random_().cpu()
    assert b.float().mean().item() == pytest.approx(0.5, abs=0.01)
    i8 = torch.empty(N, device=D, dtype=torch.int8).random_().cpu()
    assert i8.min() == 0 and i8.max() == 127
    r = torch.empty(N, device=D).random_(3, 6).cpu()
    assert set(r.unique().tolist()) == {3.0, 4.0, 5.0}
    t = torch.empty(N, device=D, dtype=torch.int16).random_(4).cpu()
    assert set(t.unique().tolist()) == {0, 1, 2, 3}
    full = torch.empty(N, device=D, dtype=torch.int64).random_(-(2**63), None).cpu()  # from without to: [from, max]
    assert (full < 0).float().mean().item() == pytest.approx(0.5, abs=0.01)


def test_randperm_is_a_permutation():
    torch.manual_seed(7)
    for n in [1, 2, 10, 1000, 100_000]:
        p = torch.randperm(n, device=D).cpu()
        assert p.dtype == torch.int64 and torch.equal(p.sort().values, torch.arange(n))
    assert torch.randperm(0, device=D).shape == (0,)
    # every position is equally likely to hold element 0
    perms = torch.stack([torch.randperm(5, device=D) for _ in range(500)]).cpu()
    counts = (perms == 0).sum(0).double()
    assert ((counts - 100) ** 2 / 100).sum() < 25  # 4 degrees of freedom: P(chi2 > 25) < 1e-4
    out = torch.empty(0, device=D, dtype=torch.int32)
    torch.randperm(50, out=out)
    assert out.dtype == torch.int32 and torch.equal(out.cpu().sort().values, torch.arange(50, dtype=torch.int32))
    h = torch.randperm(100, device=D, dtype=torch.float16).cpu()
    assert torch.equal(h.sort().values, torch.arange(100, dtype=torch.float16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_bernoulli_frequencies(dtype):
    torch.manual_seed(8)
    p = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], device=D, dtype=dtype).repeat(N // 5)
    x = torch.bernoulli(p)
    assert x.dtype == dtype
    x = x.cpu().double().view(-1, 5)
    assert set(x.unique().tolist()) <= {0.0, 1.0}
    for k, q in enumerate([0.0, 0.1, 0.5, 0.9, 1.0]):
        assert_mean(x[:, k], q, max(math.sqrt(q * (1 - q)), 1e-9))
    y = torch.empty(N, device=D, dtype=dtype).bernoulli_(0.25).cpu().double()
    assert_mean(y, 0.25, math.sqrt(0.25 * 0.75))
    z = torch.bernoulli(torch.empty(N, device=D, dtype=dtype), 0.75).cpu().double()
    assert_mean(z, 0.75, math.sqrt(0.25 * 0.75))
    w = torch.zeros(N, device=D, dtype=torch.int64).bernoulli_(torch.full((N,), 0.3, device=D)).cpu().double()
    assert_mean(w, 0.3, math.sqrt(0.3 * 0.7))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_keeps_1_minus_p_and_scales_by_its_inverse(p):
    torch.manual_seed(9)
    x = torch.rand(N, device=D, requires_grad=True)
    y = torch.nn.functional.dropout(x, p, training=True)
    xs, ys = x.detach().cpu(), y.detach().cpu()
    kept = ys != 0
    assert_mean(kept.double(), 1 - p, math.sqrt(p * (1 - p)))
    torch.testing.assert_close(ys[kept], xs[kept] / (1 - p))
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad.cpu(), kept.float() / (1 - p))
    module = torch.nn.Dropout(p)
    module.eval()
    assert torch.equal(module(x).detach().cpu(), xs)


def test_dropout_edge_cases_match_cpu():
    x = torch.randn(6, 5)
    t = x.to(D)
    for p, train in [(0.0, True), (1.0, True), (0.5, False), (0.5, None)]:
        out, mask = torch.ops.aten.native_dropout(t, p, train)
        cpu_out, cpu_mask = torch.ops.aten.native_dropout(x, p, train)
        assert out.dtype == cpu_out.dtype and mask.dtype == cpu_mask.dtype == torch.bool
        if p in (0.0, 1.0) or train is False:  # deterministic cases
            assert torch.equal(out.cpu(), cpu_out) and torch.equal(mask.cpu(), cpu_mask)
    assert torch.equal(torch.nn.functional.dropout(t, 1.0, True).cpu(), torch.zeros(6, 5))
    e = torch.ops.aten.native_dropout(torch.empty(0, 3, device=D), 0.5, True)
    assert e[0].shape == (0, 3) and e[1].shape == (0, 3)
    h = torch.nn.functional.dropout(torch.ones(1000, device=D, dtype=torch.bfloat16), 0.5, True).cpu()
    assert h.dtype == torch.bfloat16 and set(h.unique().tolist()) <= {0.0, 2.0}
    g = torch.ops.aten.native_dropout_backward(
        torch.ones(3, device=D, dtype=torch.bfloat16), torch.tensor([True, False, True], device=D), 3.0
    )
    assert torch.equal(g.cpu(), torch.tensor([3.0, 0.0, 3.0], dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bernoulli_ expects p to be in"):
        torch.ops.aten.native_dropout(t, 1.5, True)


def test_multinomial_with_replacement_frequencies():
    torch.manual_seed(10)
    w = torch.tensor([[1.0, 0.0, 3.0, 6.0], [0.0, 5.0, 0.0, 5.0]], device=D)
    s = torch.multinomial(w, N // 2, replacement=True)
    assert s.dtype == torch.int64 and s.shape == (2, N // 2)
    s = s.cpu()
    for row, probs in enumerate([[0.1, 0.0, 0.3, 0.6], [0.0, 0.5, 0.0, 0.5]]):
        freq = torch.bincount(s[row], minlength=4).double() / (N // 2)
        for k, q in enumerate(probs):
            if q == 0:
                assert freq[k] == 0
            else:
                assert abs(freq[k] - q) < 5 * math.sqrt(q * (1 - q) / (N // 2))
    one = torch.multinomial(torch.tensor([0.0, 0.0, 2.0], device=D), 50, replacement=True).cpu()
    assert (one == 2).all()


def test_multinomial_without_replacement():
    torch.manual_seed(11)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0], device=D)
    draws = torch.multinomial(w.repeat(3000, 1), 4).cpu()  # 3000 rows, each its own draw
    for row in draws:  # every draw: distinct categories, never the zero-weight one
        assert sorted(row.tolist()) == [0, 1, 2, 3]
    first = torch.bincount(draws[:, 0], minlength=5).double() / 3000
    for k, q in enumerate([0.1, 0.2, 0.3, 0.4]):  # the first draw follows the weights
        assert abs(first[k] - q) < 5 * math.sqrt(q * (1 - q) / 3000)
    rows = torch.multinomial(torch.rand(7, 20, device=D) + 0.01, 20).cpu()
    for r in rows:
        assert torch.equal(r.sort().values, torch.arange(20))


def test_other_distributions_moments():
    torch.manual_seed(12)
    e = torch.empty(N, device=D).exponential_(2.0).cpu()
    assert e.min() > 0 and torch.isfinite(e).all()
    assert_mean(e, 0.5, 0.5)
    assert ks_distance(e, lambda t: 1 - torch.exp(-2 * t)) < KS
    g = torch.empty(N, device=D).geometric_(0.25).cpu()
    assert g.min() >= 1 and torch.equal(g, g.round())
    assert_mean(g, 4, math.sqrt(0.75) / 0.25)
    gi = torch.empty(N, device=D, dtype=torch.int64).geometric_(0.5).cpu()
    assert gi.min() >= 1 and gi.dtype == torch.int64
    c = torch.empty(N, device=D).cauchy_(1.0, 2.0).cpu()
    assert ks_distance(c, lambda t: 0.5 + torch.atan((t - 1) / 2) / math.pi) < KS
    ln = torch.empty(N, device=D).log_normal_(0.5, 0.25).cpu()
    assert ln.min() > 0
    assert_mean(ln.log(), 0.5, 0.25)


def test_rrelu_in_training_draws_slopes_and_backward_uses_them():
    torch.manual_seed(13)
    x = torch.randn(N, device=D, requires_grad=True)
    y = torch.nn.functional.rrelu(x, lower=0.1, upper=0.3, training=True)
    y.backward(torch.ones_like(y))
    xs, ys, grad = x.detach().cpu(), y.detach().cpu(), x.grad.cpu()
    pos = xs > 0
    assert torch.equal(ys[pos], xs[pos]) and (grad[pos] == 1).all()
    slopes = ys[~pos] / xs[~pos]
    assert slopes.min() >= 0.1 - 1e-6 and slopes.max() <= 0.3 + 1e-6
    assert ks_distance(slopes, lambda t: ((t - 0.1) / 0.2).clamp(0, 1)) < 2.0 / math.sqrt(slopes.numel()) + 1e-5
    torch.testing.assert_close(grad[~pos], slopes)
    ev = torch.nn.functional.rrelu(x.detach(), lower=0.1, upper=0.3, training=False).cpu()
    torch.testing.assert_close(ev, torch.nn.functional.rrelu(xs, lower=0.1, upper=0.3, training=False))


# ------------------------------------------------------------------ errors, as on CPU


@pytest.mark.parametrize(
    "op, message",
    [
        (lambda: torch.empty(3, device=D).uniform_(2, 1), "uniform_ expects to return a \\[from, to\\) range"),
        (lambda: torch.empty(3, device=D).random_(5, 1), "random_ expects 'from' to be less than 'to'"),
        (lambda: torch.empty(3, device=D).bernoulli_(2.0), "bernoulli_ expects p to be in \\[0, 1\\]"),
        (lambda: torch.empty(3, device=D).normal_(0, -1), "normal expects std >= 0.0"),
        (lambda: torch.empty(3, device=D).exponential_(-1), "exponential_ expects lambda > 0.0"),
        (lambda: torch.empty(3, device=D).geometric_(2), "geometric_ expects p to be in \\(0, 1\\)"),
        (lambda: torch.empty(3, device=D).log_normal_(1, -1), "log_normal_ expects std > 0.0"),
        (lambda: torch.multinomial(torch.ones(3, device=D), 4), "cannot sample n_sample > prob_dist.size"),
        (lambda: torch.multinomial(torch.ones(3, device=D), 0), "cannot sample n_sample <= 0 samples"),
        (lambda: torch.multinomial(torch.ones(2, 2, 2, device=D), 1), "must be 1 or 2"),
        (lambda: torch.randperm(5000, device=D, dtype=torch.float16), "n cannot be greater than 2049"),
        (lambda: torch.empty(3, device=D, dtype=torch.int64).uniform_(), "uniform_ needs a floating-point tensor"),
    ],
)
def test_bad_arguments_raise_like_cpu(op, message):
    with pytest.raises(RuntimeError, match=message):
        op()


@pytest.mark.parametrize(
    "op, message",
    [
        (lambda: torch.multinomial(torch.tensor([1.0, -1.0], device=D), 1), "element < 0"),
        (lambda: torch.multinomial(torch.zeros(2, device=D), 1), "sum of probabilities <= 0"),
        (lambda: torch.bernoulli(torch.tensor([0.5, 1.5], device=D)), "p to be in \\[0, 1\\]"),
        (lambda: torch.normal(torch.zeros(2, device=D), -torch.ones(2, device=D)), "std >= 0.0"),
    ],
)
def test_bad_data_raises_at_the_next_host_read(op, message):
    # Data-dependent checks run on the device, like CUDA's asserts: raised at
    # the next host read, with the class CPU raises (RuntimeError).
    with pytest.raises(RuntimeError, match=message):
        op().cpu()
    torch.ones(1, device=D).cpu()  # the process stays usable
