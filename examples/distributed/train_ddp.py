"""Data-parallel training of the demo GPT on "tpu" with DistributedDataParallel.

    torchrun --nproc_per_node=2 examples/distributed/train_ddp.py --steps 20

Each rank trains on its share of every batch; DDP averages the gradients
through the "tpu" process group (host staging through gloo on the CPU plugin,
XLA collectives where the plugin runs programs across processes). With
--compare, rank 0 then trains the same model on the whole batches in one
process and prints how far the two runs are apart.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torch_tpu import demo


def make_optimizer(model, name, lr):
    # AdamW normalizes each gradient element: one whose gradient is near zero
    # moves by about lr either way, so the last bits in which averaged and
    # full-batch gradients differ can show in its weight. SGD keeps the
    # parameters as close as the gradients (what --compare checks tightly).
    return torch.optim.SGD(model.parameters(), lr=lr) if name == "sgd" else demo.make_optimizer(model, lr)


def train(model, data, steps, batch_size, optimizer, lr, seed, rank, world, progress, name="ddp"):
    from tqdm import tqdm

    opt = make_optimizer(model, optimizer, lr)
    share = batch_size // world
    losses = []
    bar = tqdm(total=steps, desc=f"{name} x{world}", unit="step", disable=not progress, dynamic_ncols=True)
    for x, y in demo.batches(data, steps, batch_size, demo.GPTConfig.context, seed):
        x, y = x[rank * share : (rank + 1) * share].to("tpu"), y[rank * share : (rank + 1) * share].to("tpu")
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        if world > 1:
            dist.all_reduce(total, op=dist.ReduceOp.AVG)  # the loss of the whole batch
        losses.append(total.item())
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    return losses


def main(wrap=DistributedDataParallel, gather=lambda model: list(model.parameters()), name="ddp"):
    """`wrap` makes the data-parallel model; `gather` returns its whole parameters."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8, help="global: split evenly over the ranks")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--lr", type=float, default=None, help="default: 3e-3 for AdamW, 0.1 for SGD")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", action="store_true", help="rank 0 also trains in one process and compares")
    p.add_argument("--out", help="rank 0 writes losses and comparison as JSON here")
    args = p.parse_args()
    lr = args.lr if args.lr is not None else (0.1 if args.optimizer == "sgd" else 3e-3)

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.tpu.set_device(local_rank)
    dist.init_process_group("cpu:gloo,tpu:tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert args.batch_size % world == 0, "--batch-size must split evenly over the ranks"

    tok = demo.CharTokenizer(demo.load_corpus())
    data = tok.encode(demo.load_corpus())
    model = wrap(demo.make_model(tok.vocab_size, args.seed, dropout=0.0).to("tpu"))
    losses = train(
        model, data, args.steps, args.batch_size, args.optimizer, lr, args.seed, rank, world, rank == 0, name
    )
    parameters = [p.detach().cpu() for p in gather(model)]  # every rank takes part in the gathers

    result = {"losses": losses, "world_size": world}
    if args.compare and rank == 0:
        single = demo.make_model(tok.vocab_size, args.seed, dropout=0.0).to("tpu")
        reference = train(single, data, args.steps, args.batch_size, args.optimizer, lr, args.seed, 0, 1, True, "one")
        loss_diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference, strict=True))
        param_diff = max(
            ((a - b.detach().cpu()).abs().max() / b.detach().cpu().abs().max().clamp_min(1e-12)).item()
            for a, b in zip(parameters, single.parameters(), strict=True)
        )
        result.update(reference_losses=reference, max_rel_loss_diff=loss_diff, max_rel_param_diff=param_diff)
        print(
            f"{name} x{world} vs one process: max relative loss difference {loss_diff:.2e}, parameters {param_diff:.2e}"
        )
    if rank == 0:
        print(f"final loss {losses[-1]:.4f} after {args.steps} steps on {world} ranks")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
