"""Ordinary tensor programs give the same result on "tpu" as on CPU."""

import torch


def program(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 6, generator=g).to(device)
    idx = torch.tensor([5, 0, 3, 3]).to(device)
    out = {}
    # indexing and masking
    out["gathered"] = x[idx, 1:4]
    out["masked"] = x[x > 0.5]
    out["nonzero"] = torch.nonzero(x[:, 0] > 0)
    x2 = x.clone()
    x2[x2 < -1] = 0.0
    out["clamped_by_mask"] = x2
    # in-place updates on views
    y = torch.zeros(4, 5, device=device)
    y[1:3, ::2] += 1
    y.t()[4].sub_(2)
    y[:, 1].copy_(torch.arange(4.0))
    y.diagonal().mul_(10)
    out["views"] = y
    # reductions and sorting
    out["stats"] = torch.stack([x.sum(), x.mean(), x.std(), x.amax(), x.amin()])
    out["argmax"] = x.argmax(dim=1)
    values, order = torch.sort(x[:, 2], descending=True)
    out["sorted"] = values
    out["order"] = order
    out["topk"] = torch.topk(x.flatten(), 5).values
    out["cumsum"] = torch.cumsum(x, dim=0)
    # a small numeric pipeline
    h = torch.relu(x @ x.t()[:, :6] + 1).softmax(-1)
    out["pipeline"] = torch.nn.functional.layer_norm(h, (6,))
    out["scatter"] = torch.zeros(3, 6, device=device).scatter_add_(0, (idx[:3] % 3)[:, None].expand(3, 6), x[:3])
    return {k: v.cpu() for k, v in out.items()}


def test_ordinary_tensor_program_matches_cpu():
    expected = program("cpu")
    actual = program("tpu")
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, rtol=1e-5, atol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
