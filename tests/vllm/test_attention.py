"""Paged attention against a per-token reference, on CPU and on tpu, for the
step shapes vLLM makes: decode, short chunks, long prefills, padding tokens."""

import pytest
import torch

import torch_tpu  # noqa: F401 (the tpu device)
from torch_tpu._compile import program
from torch_tpu.vllm.attention import _attention, _write_and_attend, _write_and_attend_on_tpu, cache_rows, query_bucket
from torch_tpu.vllm.worker import warm_up_prompt_lengths

BLOCKS, BLOCK, KV_HEADS, HEADS, HEAD = 64, 4, 2, 4, 8
REQUESTS, PER_REQUEST = 6, 8  # block-table rows (the runner's max_num_seqs) and blocks per row


def reference(query, kv_cache, block_table, seq_lens, query_start_loc, scale, sliding_window, soft_cap):
    """Each real query token over its request's cached keys, one token at a time."""
    out = torch.zeros_like(query)
    for r in range(REQUESTS):
        start, end, seq = int(query_start_loc[r]), int(query_start_loc[r + 1]), int(seq_lens[r])
        slots = [int(block_table[r, p // BLOCK]) * BLOCK + p % BLOCK for p in range(seq)]
        rows = kv_cache.transpose(1, 2).reshape(BLOCKS * BLOCK, KV_HEADS, 2 * HEAD)[slots]  # [seq, kv heads, 2 * head]
        key, value = rows[..., :HEAD], rows[..., HEAD:]
        for t in range(start, end):
            pos = seq - (end - t)
            for h in range(HEADS):
                k, v = key[:, h // (HEADS // KV_HEADS)], value[:, h // (HEADS // KV_HEADS)]
                s = (k @ query[t, h]) * scale
                if soft_cap:
                    s = torch.tanh(s / soft_cap) * soft_cap
                visible = torch.arange(seq) <= pos
                if sliding_window:
                    visible &= torch.arange(seq) > pos - sliding_window
                out[t, h] = torch.softmax(s.masked_fill(~visible, float("-inf")), 0) @ v
    return out


@pytest.mark.parametrize(
    "tokens, query_lens, context",
    [
        (8, [1, 1, 1, 1, 1], [5, 9, 30, 0, 17]),  # decode (3 padding tokens)
        (32, [4, 3, 7, 5], [0, 6, 12, 20]),  # short chunks, some after a cached prefix
        (32, [20, 1, 2], [3, 0, 9]),  # a long prefill among decodes
        (16, [16], [0]),  # one prompt filling the bucket
    ],
)
@pytest.mark.parametrize("window, cap", [(0, 0.0), (5, 0.0), (0, 2.0)])
@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_paged_attention_matches_a_per_token_reference(tokens, query_lens, context, window, cap, device):
    g = torch.Generator().manual_seed(tokens + len(query_lens))
    kv_cache = torch.randn(BLOCKS, BLOCK, KV_HEADS, 2 * HEAD, generator=g).permute(0, 2, 1, 3)  # LBNHC
    block_table = torch.randperm(BLOCKS, generator=g)[: REQUESTS * PER_REQUEST].view(REQUESTS, PER_REQUEST)
    n = len(query_lens)
    query_start_loc = torch.zeros(REQUESTS + 1, dtype=torch.int32)
    query_start_loc[1 : n + 1] = torch.tensor(query_lens).cumsum(0)
    query_start_loc[n + 1 :] = query_start_loc[n]  # rows past the requests repeat the end
    seq_lens = torch.zeros(REQUESTS, dtype=torch.int32)
    seq_lens[:n] = torch.tensor(query_lens) + torch.tensor(context)
    query = torch.randn(tokens, HEADS, HEAD, generator=g)
    args = (
        BLOCK,
        block_table.int(),
        seq_lens,
        query_start_loc,
        query_bucket(max(query_lens), tokens),
        0.3,
        window,
        cap,
    )
    expected = reference(query, kv_cache, block_table, seq_lens, query_start_loc, 0.3, window, cap)
    if device == "tpu":
        tpu = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in (query, cache_rows(kv_cache), *args)]
        got = program(_attention)(*tpu).cpu()
    else:
        got = _attention(query, cache_rows(kv_cache), *args)
    real = int(query_start_loc[n])
    torch.testing.assert_close(got[:real], expected[:real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got).all(), "padding tokens get finite rows"


def test_a_layer_step_writes_the_cache_and_attends_in_place_on_tpu():
    """The layer's step (KV write by slot mapping, then attention into the given
    output) as one tpu program: the cache and the output are written in place,
    as on CPU; padding tokens (slot -1) write to the reserved slot 0."""
    g = torch.Generator().manual_seed(7)
    tokens, query_lens, context = 8, [3, 1, 2], [4, 9, 0]
    kv_cache = torch.randn(BLOCKS, BLOCK, KV_HEADS, 2 * HEAD, generator=g).permute(0, 2, 1, 3)  # LBNHC
    block_table = torch.randperm(BLOCKS - 1, generator=g)[: REQUESTS * PER_REQUEST].view(REQUESTS, PER_REQUEST) + 1
    n = len(query_lens)
    query_start_loc = torch.zeros(REQUESTS + 1, dtype=torch.int32)
    query_start_loc[1 : n + 1] = torch.tensor(query_lens).cumsum(0)
    query_start_loc[n + 1 :] = query_start_loc[n]
    seq_lens = torch.zeros(REQUESTS, dtype=torch.int32)
    seq_lens[:n] = torch.tensor(query_lens) + torch.tensor(context)
    slot_mapping = torch.full((16,), -1, dtype=torch.int64)  # the runner's whole buffer: PAD past the tokens
    t = 0
    for r, (q, c) in enumerate(zip(query_lens, context, strict=True)):
        for p in range(c, c + q):
            slot_mapping[t] = int(block_table[r, p // BLOCK]) * BLOCK + p % BLOCK
            t += 1
    query = torch.randn(tokens, HEADS, HEAD, generator=g)
    key, value = torch.randn(2, tokens, KV_HEADS, HEAD, generator=g)
    args = (BLOCK, block_table.int(), seq_lens, query_start_loc, query_bucket(max(query_lens), tokens), 0.3, 0, 0.0)

    cpu_cache, cpu_out = kv_cache.clone(), torch.zeros(tokens, HEADS, HEAD)
    _write_and_attend(cache_rows(cpu_cache), slot_mapping, key, value, query, cpu_out, *args)
    tpu_cache, tpu_out = kv_cache.to("tpu"), torch.zeros(tokens, HEADS, HEAD, device="tpu")
    tpu = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in (slot_mapping, key, value, query, *args)]
    _write_and_attend_on_tpu(cache_rows(tpu_cache), *tpu[:4], tpu_out, *tpu[4:])

    written = slot_mapping[:t]
    rows = cache_rows(cpu_cache)
    torch.testing.assert_close(rows[written], torch.cat([key, value], -1)[:t])  # the step's tokens, in their slots
    expected = reference(query, cpu_cache, block_table, seq_lens, query_start_loc, 0.3, 0, 0.0)
    torch.testing.assert_close(cpu_out[:t], expected[:t], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tpu_cache.cpu(), cpu_cache, rtol=0, atol=0)
    torch.testing.assert_close(tpu_out.cpu(), cpu_out, rtol=1e-5, atol=1e-5)
    # A layer that reads an earlier layer's cache (KV sharing) calls the custom op.
    shared = torch.ops.torch_tpu.paged_attention(tpu[3], tpu_cache, *tpu[5:])
    torch.testing.assert_close(shared.cpu(), cpu_out, rtol=1e-5, atol=1e-5)


def test_query_bucket():
    assert [query_bucket(n, 256) for n in (1, 2, 16, 17, 256)] == [1, 16, 16, 256, 256]
    assert [query_bucket(n, 8) for n in (1, 5, 8)] == [1, 8, 8]


def test_warm_up_runs_every_query_bucket_of_every_token_bucket():
    buckets = [8, 16, 32, 64, 128, 256]
    for max_num_seqs in (1, 4, 16):
        warmed = set()

        def bucket_of(tokens):
            return next(b for b in buckets if b >= tokens)

        for lengths in warm_up_prompt_lengths(max_num_seqs, 256, buckets):
            prefill, decode = bucket_of(sum(lengths)), bucket_of(len(lengths))  # a step of each
            warmed |= {(prefill, query_bucket(max(lengths), prefill)), (decode, 1)}
        for previous, bucket in zip([0, *buckets], buckets, strict=False):
            for count in range(1, max_num_seqs + 1):  # any step a scheduler can make in this bucket
                for longest in range(1, bucket + 1):
                    if longest * count > previous and count - 1 + longest <= bucket:
                        assert (bucket, query_bucket(longest, bucket)) in warmed, (max_num_seqs, bucket, longest)
