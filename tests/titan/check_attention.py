"""Checks run_titan.py's attention substitution against TorchTitan's FlexAttention.

TorchTitan's block-causal packed-document mask (its own mask_mods, as its Decoder
builds them) with its FlexAttention module (torch's flex_attention, eager, forward
only: torch 2.13 has no FlexAttention backward on CPU), against the adapter's dense
mask + scaled_dot_product_attention on CPU and on tpu. Exit status 1 on a mismatch.
"""

import sys

import run_titan
import torch
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention
from torchtitan.models.common import decoder
from torchtitan.models.common.attention import (
    FlexAttention,
    get_causal_mask_mod,
    get_efficient_causal_mask_mod_for_packed_document,
)

TOL = 2e-6


def positions_with_documents(B, L, gen):
    """Per-token positions that restart at 0 where a packed document starts."""
    pos = torch.empty(B, L, dtype=torch.int64)
    for b in range(B):
        starts = sorted({0, *torch.randint(1, L, (5,), generator=gen).tolist()})
        for s, e in zip(starts, starts[1:] + [L], strict=True):
            pos[b, s:e] = torch.arange(e - s)
    return pos


def outputs(attn, create_mask, q, k, v, positions):
    B, L = positions.shape
    mask_mod = and_masks(get_causal_mask_mod(), get_efficient_causal_mask_mod_for_packed_document(positions))
    masks = create_mask(mask_mod, B, None, L, L, device=positions.device)
    return attn(q, k, v, attention_masks=masks).cpu()


def main():
    gen = torch.Generator().manual_seed(0)
    B, L, N, H = 2, 256, 16, 16
    q, k, v = (torch.randn(B, L, N, H, generator=gen) for _ in range(3))
    positions = positions_with_documents(B, L, gen)

    FlexAttention._compiled_flex_attn = flex_attention  # eager, forward only
    attn = FlexAttention(FlexAttention.Config())
    with torch.no_grad():
        want = outputs(attn, create_block_mask, q, k, v, positions)

    run_titan.patch_attention()
    ok = True
    for device in ("cpu", "tpu"):
        with torch.no_grad():
            got = outputs(
                attn,
                decoder.create_attention_mask,
                *(t.to(device) for t in (q, k, v, positions)),
            )
        err = (got - want).abs().max().item()
        print(f"dense-mask SDPA on {device} vs TorchTitan FlexAttention: max |diff| {err:.2e}")
        ok &= err <= TOL
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
