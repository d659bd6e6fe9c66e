"""Checkpoints: torch.save / torch.load of tpu tensors and state dicts, and
bit-exact moves between tpu and CPU."""

import io

import pytest
import torch

import torch_tpu  # noqa: F401

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.int32, torch.uint8]


def special_values(dtype):
    """Every bit pattern class: random bits (NaN payloads, subnormals, -0.0, inf) for floats."""
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.randint(0, 2, (37,), generator=g).bool()
    if dtype.is_floating_point:
        bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[dtype]
        info = torch.iinfo(bits)
        raw = torch.randint(info.min, info.max, (61,), generator=g, dtype=bits)
        x = raw.view(dtype).clone()
        x[:4] = torch.tensor([0.0, -0.0, float("inf"), float("-inf")]).to(dtype)
        return x
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (53,), generator=g, dtype=dtype)


def bits(t):
    t = t.cpu()
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.dtype.is_floating_point:
        return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])
    return t


def assert_bit_exact(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(bits(a), bits(b))


def roundtrip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_to_and_back_bit_exact(dtype):
    x = special_values(dtype)
    y = x.to("tpu")
    assert y.device.type == "tpu"
    assert_bit_exact(y.cpu(), x)
    assert_bit_exact(y.to("cpu"), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_save_tpu_load_tpu_and_cpu(dtype):
    x = special_values(dtype).to("tpu")
    loaded = roundtrip(x)  # no map_location: back on tpu, like CUDA
    assert loaded.device == torch.device("tpu:0")
    assert_bit_exact(loaded.cpu(), x.cpu())
    on_cpu = roundtrip(x, map_location="cpu")
    assert on_cpu.device.type == "cpu"
    assert_bit_exact(on_cpu, x.cpu())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_save_cpu_load_to_tpu(dtype):
    x = special_values(dtype)
    for where in ("tpu", "tpu:0", torch.device("tpu"), {"cpu": "tpu:0"}):
        loaded = roundtrip(x, map_location=where)
        assert loaded.device == torch.device("tpu:0"), where
        assert_bit_exact(loaded.cpu(), x)


def test_loaded_tensor_is_usable():
    x = roundtrip(torch.arange(12.0).view(3, 4), map_location="tpu")
    x[1].add_(1)
    assert (x * 2).sum().item() == 2 * (66 + 4)
    y = roundtrip(torch.arange(5), map_location="tpu")
    assert y.float().mean().item() == 2.0


def test_views_share_storage_saved_once():
    base = torch.arange(1000.0, device="tpu")
    views = {"base": base, "slice": base[100:200], "grid": base.view(10, 100)[:, 5], "t": base.view(20, 50).t()}
    one = io.BytesIO()
    torch.save(base, one)
    all_views = io.BytesIO()
    torch.save(views, all_views)
    # One storage of 4000 bytes in both files: the views add only metadata.
    assert len(all_views.getvalue()) < len(one.getvalue()) + 1500
    all_views.seek(0)
    loaded = torch.load(all_views)
    for name, v in views.items():
        assert loaded[name].device.type == "tpu"
        assert loaded[name].stride() == v.stride() and loaded[name].storage_offset() == v.storage_offset()
        assert torch.equal(loaded[name].cpu(), v.cpu()), name
    assert loaded["slice"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    loaded["base"][150] = -1.0  # every alias sees a write, as before saving
    assert loaded["slice"][50].item() == -1.0
    assert loaded["t"][0, 3].item() == -1.0


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 5),
    )


def test_model_to_tpu_and_back_bit_exact():
    model = make_model()
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    model.to("tpu")
    assert all(v.device.type == "tpu" for v in model.state_dict().values())
    model.to("cpu")
    for k, v in model.state_dict().items():
        assert_bit_exact(v, reference[k])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_model_state_dict_checkpoint(dtype):
    model = make_model().to(dtype).to("tpu")
    state = model.state_dict()
    loaded = roundtrip(state)
    assert list(loaded) == list(state)
    for k, v in state.items():
        assert loaded[k].device.type == "tpu"
        assert_bit_exact(loaded[k], v)
    fresh = make_model().to(dtype)
    for p in fresh.parameters():
        torch.nn.init.zeros_(p)
    fresh.load_state_dict(roundtrip(state, map_location="cpu"))
    fresh.to("tpu")
    x = torch.randn(2, 3, 6, 6).to(dtype)
    model.eval()
    fresh.eval()
    assert_bit_exact(fresh(x.to("tpu")), model(x.to("tpu")))


def test_training_checkpoint_resume():
    """Model and optimizer state saved mid-training resume to the same next step."""
    model = make_model().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 3, 6, 6).to("tpu"), torch.randint(0, 5, (4,)).to("tpu")

    def step(m, o):
        o.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        o.step()

    step(model, opt)
    checkpoint = roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
    assert checkpoint["opt"]["state"][0]["momentum_buffer"].device.type == "tpu"
    resumed = make_model().to("tpu")
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt = torch.optim.SGD(resumed.parameters(), lr=0.1, momentum=0.9)
    resumed_opt.load_state_dict(checkpoint["opt"])
    step(model, opt)
    step(resumed, resumed_opt)
    for a, b in zip(model.parameters(), resumed.parameters(), strict=True):
        assert_bit_exact(a, b)


def test_storage_reinterpretation_through_views():
    """A storage written as one dtype and read as another of a different size
    (what storage-level copies do) keeps its bytes."""
    x = torch.tensor([1.5, -2.0, float("nan")], device="tpu")
    as_bytes = x.view(torch.uint8)
    assert torch.equal(as_bytes.cpu(), x.cpu().view(torch.uint8))
    storage = x.untyped_storage()
    assert torch.equal(torch.tensor(storage.cpu().tolist(), dtype=torch.uint8), x.cpu().view(torch.uint8))
    y = torch.empty(0, dtype=torch.int16, device="tpu").set_(storage, 0, (6,), (1,))
    assert torch.equal(y.cpu(), x.cpu().view(torch.int16))
    y[1] = 7  # a partial write through the narrower dtype
    expected = x.cpu().view(torch.int16).clone()
    expected[1] = 7
    assert torch.equal(x.cpu().view(torch.int16), expected)
