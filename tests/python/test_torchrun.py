"""torch.distributed on "tpu" across processes: torchrun launches 2 ranks on
127.0.0.1 (host staging through gloo: the CPU plugin runs no program across
processes). Launches cost seconds each: few and small."""

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: Path, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(script), *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.parametrize("example", ["train_ddp.py", "train_fsdp2.py"])
def test_data_parallel_training_matches_one_process_on_the_full_batch(tmp_path, example):
    out = tmp_path / "result.json"
    script = REPO / "examples/distributed" / example
    r = torchrun(script, "--steps", "4", "--optimizer", "sgd", "--compare", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and len(result["losses"]) == 4
    assert result["max_rel_loss_diff"] < 1e-5, result
    assert result["max_rel_param_diff"] < 1e-5, result
    assert result["losses"][-1] < result["losses"][0]


def test_mismatched_shapes_and_a_dead_rank_raise_clear_errors(tmp_path):
    script = tmp_path / "mismatch.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, time, datetime, torch, torch.distributed as dist
            dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=20))
            rank = dist.get_rank()
            try:
                dist.all_reduce(torch.ones(4 + rank, device="tpu"))
            except RuntimeError as e:
                print(f"rank {rank} raised: {e}", flush=True)
            t = torch.ones(2, device="tpu")
            dist.all_reduce(t)  # the group stays usable
            print(f"rank {rank} then summed {t.cpu().tolist()}", flush=True)
            if rank == 1:
                os._exit(0)  # dies without a word (exit code 0: torchrun lets rank 0 go on)
            time.sleep(1)
            start = time.monotonic()
            try:
                dist.all_reduce(t)
            except RuntimeError as e:
                print(f"rank 0 after {time.monotonic() - start:.0f} s: {e}", flush=True)
            """
        )
    )
    r = torchrun(script, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "The process of rank 1 (pid" in r.stdout and "has exited" in r.stdout, r.stdout[-3000:]
    for rank in (0, 1):
        assert (
            f"rank {rank} raised: torch_tpu: the ranks of a process group made different collective calls" in r.stdout
        )
        assert f"rank {rank} then summed [2.0, 2.0]" in r.stdout
    assert "rank 0: all_reduce SUM of f32[4]" in r.stdout and "rank 1: all_reduce SUM of f32[5]" in r.stdout
