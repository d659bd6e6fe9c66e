"""Paged attention on the device, as vLLM's attention backend "TORCH_TPU".

The KV cache of a layer is vLLM's [blocks, kv heads, block size, 2 * head size]
view in the LBNHC layout: transposed to [blocks, block size, kv heads, ...] it
is contiguous, so it flattens to one row per slot. Writes go to the rows of
`slot_mapping`; reads gather the rows of each token's request from its block
table row. Both are device ops on device tensors: no host work per step.
Prefill and decode tokens of any mix of requests run in one call.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

from torch_tpu._compile import program


def _attention(
    query: torch.Tensor,  # [tokens, heads, head size]
    rows: torch.Tensor,  # [slots, kv heads, 2 * head size]: the cache, a row per slot (see cache_rows)
    block_size: int,
    block_table: torch.Tensor,  # [requests, blocks per request]
    seq_lens: torch.Tensor,  # [requests]: tokens in the cache after this step
    query_start_loc: torch.Tensor,  # [requests + 1]: each request's first query token
    max_query: int,  # at least the most query tokens of any request (query_bucket)
    scale: float,
    sliding_window: int,  # keys within this many positions of the query; 0: all
    soft_cap: float,  # logits capped to +-soft_cap by tanh; 0: none
) -> torch.Tensor:
    tokens, heads, head_size = query.shape
    num_slots, kv_heads, _ = rows.shape
    requests, per_request = block_table.shape
    span = per_request * block_size
    # Each request's keys and values, gathered once (not once per query token):
    # [requests, span, kv heads, 2 * head size].
    blocks = rows.view(num_slots // block_size, block_size, kv_heads, -1)  # whole blocks: a few large copies
    kv = blocks[block_table.long().clamp(0, blocks.shape[0] - 1)].view(requests, span, kv_heads, -1)
    key_pos = torch.arange(span, device=query.device)
    key, value = kv[..., :head_size].float(), kv[..., head_size:].float()
    # Each request's query tokens, padded to max_query: [requests, max_query, kv heads, group, head size].
    start = query_start_loc[:requests].long()
    count = query_start_loc[1 : requests + 1].long() - start
    i = torch.arange(max_query, device=query.device)
    token = (start[:, None] + i).clamp(0, tokens - 1)
    q = query.float()[token].view(requests, max_query, kv_heads, heads // kv_heads, head_size)
    scores = _scores(q, key) * scale  # [requests, max_query, span, kv heads, group]
    if soft_cap > 0:
        scores = torch.tanh(scores / soft_cap) * soft_cap
    # A request's query tokens are the last of its sequence: the position of each follows from that.
    seq_len = seq_lens.long()[:, None, None]
    pos = seq_len - count[:, None, None] + i[None, :, None]  # [requests, max_query, 1]
    visible = (key_pos <= pos) & (key_pos < seq_len)
    if sliding_window > 0:
        visible = visible & (key_pos > pos - sliding_window)
    # Finite: a padding query (past a request's count, or a row past the requests) sees no key
    # and gets a finite row that no token reads.
    scores = scores.masked_fill(~visible[..., None, None], torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=2)
    out = _weighted(probs, value).reshape(requests * max_query, heads, head_size)
    # Back in token order: token t is query t - start of its request. Padding tokens
    # past the last request read some row; theirs are ignored.
    t = torch.arange(tokens, device=query.device, dtype=query_start_loc.dtype)
    request = torch.bucketize(t, query_start_loc[1 : requests + 1], right=True).clamp(max=requests - 1)
    row = request * max_query + (t.long() - start[request]).clamp(0, max_query - 1)
    return out[row].to(query.dtype)


# XLA:CPU runs these small batched products fastest as a dot for a few queries
# per request, and as products summed in place (fused with the gather) for one
# query per request (decode: 0.6 vs 0.8 ms) or many (16 ms vs 76 ms at 256).
def _as_dot(max_query: int) -> bool:
    return 1 < max_query <= 64


def _scores(q: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """q [r, q, h, g, d] . key [r, s, h, d] -> [r, q, s, h, g]."""
    if _as_dot(q.shape[1]):
        return torch.einsum("rqhgd,rshd->rqshg", q, key)
    return (q[:, :, None] * key[:, None, :, :, None, :]).sum(-1)


def _weighted(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """probs [r, q, s, h, g] . value [r, s, h, d] -> [r, q, h, g, d]."""
    if _as_dot(probs.shape[1]):
        return torch.einsum("rqshg,rshd->rqhgd", probs, value)
    return (probs[..., None] * value[:, None, :, :, None, :]).sum(2)


def query_bucket(max_query_len: int, tokens: int) -> int:
    """The query rows attention pads each request to: 1 (decode steps), 16 (short
    chunks), else all `tokens`. Few values, so few programs per token bucket;
    attention's work grows with requests x this, not with tokens x cached keys."""
    for bucket in (1, 16):
        if max_query_len <= bucket:
            return min(bucket, tokens)
    return tokens


def cache_rows(kv_cache: torch.Tensor) -> torch.Tensor:
    """A layer's cache, [blocks, kv heads, block size, C] in the LBNHC layout, as
    its [blocks * block size, kv heads, C] rows: a contiguous view of the whole
    storage (programs then read it as it is, with no copy)."""
    blocks, kv_heads, block_size, channels = kv_cache.shape
    return kv_cache.transpose(1, 2).view(blocks * block_size, kv_heads, channels)


@torch.library.custom_op("torch_tpu::paged_attention", mutates_args=())
def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query: int,
    scale: float,
    sliding_window: int,
    soft_cap: float,
) -> torch.Tensor:
    """Attention of each query token over its request's cached keys (see _attention)."""
    rows, block_size = cache_rows(kv_cache), kv_cache.shape[2]
    return _attention(
        query, rows, block_size, block_table, seq_lens, query_start_loc, max_query, scale, sliding_window, soft_cap
    )


_attention_on_tpu = program(_attention)  # one XLA program per shape (the token buckets), not one per op


@paged_attention.register_kernel("tpu")
def _(query, kv_cache, block_table, seq_lens, query_start_loc, max_query, scale, sliding_window, soft_cap):
    rows, block_size = cache_rows(kv_cache), kv_cache.shape[2]
    return _attention_on_tpu(
        query, rows, block_size, block_table, seq_lens, query_start_loc, max_query, scale, sliding_window, soft_cap
    )


@paged_attention.register_fake
def _(query, kv_cache, block_table, seq_lens, query_start_loc, max_query, scale, sliding_window, soft_cap):
    return torch.empty_like(query)


def _write_rows(rows: torch.Tensor, slot_mapping: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """Writes each token's key and value into its slot; padding tokens (slot -1)
    write to slot 0, in block 0, which vLLM reserves and never reads."""
    slots = slot_mapping[: key.shape[0]].long().clamp(min=0)
    rows.index_copy_(0, slots, torch.cat([key, value], dim=-1).to(rows.dtype))


def _write_and_attend(rows, slot_mapping, key, value, query, output, *attention_args) -> None:
    """A layer's attention step: its tokens' keys and values into the cache rows,
    then attention over them into `output`."""
    _write_rows(rows, slot_mapping, key, value)
    output.copy_(_attention(query, rows, *attention_args))


# On tpu the layer's step is one program that overwrites the cache in place (its
# buffer donated; an eager index_copy_ would copy the layer's whole cache every
# step): one launch instead of a KV write, attention and a copy, and one call
# from vLLM's attention layer instead of two (forward_includes_kv_cache_update).
_write_and_attend_on_tpu = program(_write_and_attend)


@dataclass
class TpuAttentionMetadata:
    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool


def whole_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t`, a slice of the model runner's persistent buffer, widened to the buffer's
    first `rows` rows: attention's shapes then depend on the token bucket only, not
    on the number of requests (rows past them: query_start_loc repeats its last
    value, seq_lens is 0, so no token reads them)."""
    if t.shape[0] >= rows:
        return t
    needed = t.storage_offset() + (rows - 1) * t.stride(0) + (t[0].numel() if t.dim() > 1 else 1)
    if t.untyped_storage().nbytes() < needed * t.element_size():
        return t
    return t.as_strided((rows, *t.shape[1:]), t.stride(), t.storage_offset())


class TpuAttentionMetadataBuilder(AttentionMetadataBuilder[TpuAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> TpuAttentionMetadata:
        m = common_attn_metadata
        rows = self.vllm_config.scheduler_config.max_num_seqs
        return TpuAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            query_start_loc=whole_rows(m.query_start_loc, rows + 1),
            seq_lens=whole_rows(m.seq_lens, rows).to(m.query_start_loc.device),  # on tpu a host buffer (worker.py)
            block_table=whole_rows(m.block_table_tensor, rows),
            slot_mapping=m.slot_mapping,
            causal=m.causal,
        )


class TpuAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16", "float32"]
    forward_includes_kv_cache_update: bool = True  # forward writes the step's keys and values, then reads

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return TpuAttentionImpl

    @staticmethod
    def get_builder_cls():
        return TpuAttentionMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple:
        return (KVCacheLayout.LBNHC,)  # a slot's row is contiguous: cache_rows views it


class TpuAttentionImpl(AttentionImpl):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes,
        sliding_window,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        **kwargs,
    ) -> None:
        if alibi_slopes is not None:
            raise NotImplementedError("torch_tpu's vLLM attention: ALiBi slopes are not supported yet")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"torch_tpu's vLLM attention: {attn_type} attention is not supported yet")
        if num_heads % num_kv_heads:
            raise ValueError(f"torch_tpu's vLLM attention: {num_heads} heads is not a multiple of {num_kv_heads}")
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = float(scale)
        self.sliding_window = int(sliding_window or 0)
        self.soft_cap = float(logits_soft_cap or 0)
        self.kv_cache_dtype = kv_cache_dtype
        self.writes_kv_cache = kv_sharing_target_layer_name is None  # else an earlier layer wrote it

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None, output_block_scale=None
    ):
        if attn_metadata is None:  # a profile or warm-up run without a cache
            return output
        m = attn_metadata
        tokens = query.shape[0]
        query = query.view(tokens, self.num_heads, self.head_size)
        out = output.view(tokens, self.num_heads, self.head_size)
        block_size = kv_cache.shape[2]
        args = (m.block_table, m.seq_lens, m.query_start_loc, query_bucket(m.max_query_len, tokens))
        args += (self.scale, self.sliding_window, self.soft_cap)
        if not self.writes_kv_cache or key is None or value is None:
            out.copy_(torch.ops.torch_tpu.paged_attention(query, kv_cache, *args))
            return output
        rows = cache_rows(kv_cache)
        key, value = key.view(tokens, self.num_kv_heads, -1), value.view(tokens, self.num_kv_heads, -1)
        step = _write_and_attend_on_tpu if query.device.type == "tpu" else _write_and_attend
        step(rows, m.slot_mapping, key, value, query, out, block_size, *args)
        return output
