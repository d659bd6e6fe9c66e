"""The main job: a small MLP forward pass on "tpu" and on CPU, side by side.

Run with `make demo` or `python -m torch_tpu.demo`.
"""

import time

import torch

import torch_tpu


def mlp(sizes: list[int]) -> torch.nn.Sequential:
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def main() -> None:
    torch.manual_seed(0)
    model = mlp([64, 256, 256, 10])
    x = torch.randn(32, 64)
    expected = model(x)

    model_tpu = mlp([64, 256, 256, 10])
    model_tpu.load_state_dict(model.state_dict())
    model_tpu = model_tpu.to("tpu")
    x_tpu = x.to("tpu")

    torch_tpu.reset_metrics()
    with torch.no_grad():
        first = time.perf_counter()
        out = model_tpu(x_tpu)
        torch.tpu.synchronize()
        first = time.perf_counter() - first
        compiles = torch_tpu.metrics().get("compiles", 0)
        steps, t0 = 20, time.perf_counter()
        for _ in range(steps):
            out = model_tpu(x_tpu)
        torch.tpu.synchronize()
        per_forward = (time.perf_counter() - t0) / steps
    m = torch_tpu.metrics()
    ops_per_forward = (m["executions"] - compiles) / (steps + 1) if steps else 0

    diff = (out.cpu() - expected.detach()).abs().max().item()
    print(f"platform:          {torch.tpu.get_device_name()}  (PJRT C API {torch_tpu._C.plugin_api_version()})")
    print(f"plugin:            {torch_tpu._C.plugin_path()}")
    print(f"output:            {tuple(out.shape)} {out.dtype} on {out.device}")
    print(f"max |tpu - cpu|:   {diff:.3e}")
    print(f"compiles:          {compiles} on the first forward, {m['compiles'] - compiles} after")
    print(f"first forward:     {first * 1e3:.1f} ms (compiles included)")
    print(f"steady forward:    {per_forward * 1e6:.0f} us, ~{ops_per_forward:.0f} device executions each")
    print(f"per-op time:       {per_forward / max(ops_per_forward, 1) * 1e6:.1f} us")
    print("result:            " + ("MATCHES CPU" if diff < 1e-4 else "DIFFERS FROM CPU"))
    if diff >= 1e-4:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
