"""Fully sharded data-parallel training (FSDP2, `fully_shard`) of the demo GPT on "tpu".

    torchrun --nproc_per_node=2 examples/distributed/train_fsdp2.py --steps 20

Each transformer block and the whole model are sharded over the ranks: each
rank holds a shard of every parameter, all-gathers a block's parameters
before using them and reduce-scatters its gradients. With --compare, rank 0
then trains the same model on the whole batches in one process and prints
how far the two runs are apart.
"""

import torch
from torch.distributed.fsdp import fully_shard
from train_ddp import main


def shard(model: torch.nn.Module) -> torch.nn.Module:
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def full_parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    """The whole parameters, gathered from every rank's shards."""
    return [p.full_tensor() for p in model.parameters()]


if __name__ == "__main__":
    main(wrap=shard, gather=full_parameters, name="fsdp2")
