"""vLLM's GPU worker and model runner (v1), on the "tpu" device.

What differs from CUDA: no CUDA graphs; vLLM's streams and events are tpu's
(async scheduling works as on CUDA: the sampled tokens' copy to the host is
started, not awaited); the KV cache is sized from the device's free memory
after a profile run; in compiled mode every step's token count is padded up to
a bucket compiled at start-up, and the step's index arithmetic (positions,
sequence lengths) runs on the host, so no device program is shaped by the
step's token or request count; slot mapping is plain aten ops instead of a
Triton kernel.
"""

import bisect
import contextlib
import gc
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from vllm.config import CompilationMode, CUDAGraphMode
from vllm.forward_context import BatchDescriptor
from vllm.logger import init_logger
from vllm.v1.worker import gpu_model_runner as runner_module
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

import torch_tpu
from torch_tpu._compile import program
from torch_tpu.vllm.attention import whole_rows

logger = init_logger(__name__)


def compute_slot_mapping(
    num_tokens,
    max_num_tokens,
    query_start_loc,
    positions,
    block_table,
    block_table_stride,
    slot_mapping,
    KV_CACHE_BLOCK_SIZE,  # noqa: N803 (the Triton kernel's parameter names)
    TOTAL_CP_WORLD_SIZE=1,  # noqa: N803
    TOTAL_CP_RANK=0,  # noqa: N803
    CP_KV_CACHE_INTERLEAVE_SIZE=1,  # noqa: N803
    PAD_ID=-1,  # noqa: N803
    BLOCK_SIZE=1024,  # noqa: N803
):
    """vLLM's ComputeSlotMappingKernel in device ops: each token's KV slot from its
    request's block table row and its position; PAD_ID past the last token.
    Computed over all max_num_tokens rows of the runner's persistent buffers, so
    its shapes never change with the step's token count (nothing to compile)."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("torch_tpu's vLLM worker: context parallelism is not supported")
    table = block_table.view(-1, block_table_stride)
    starts = whole_rows(query_start_loc, table.shape[0] + 1)[1:]  # past the last request: its end, repeated
    pos = whole_rows(positions, max_num_tokens).to(table.device)  # on tpu the runner keeps positions on the host
    write = _write_slot_mapping_on_tpu if pos.device.type == "tpu" else _write_slot_mapping
    # The token count as a tensor: one program for every count.
    write(slot_mapping[:max_num_tokens], table, starts, pos, torch.tensor(num_tokens), KV_CACHE_BLOCK_SIZE, PAD_ID)


def _write_slot_mapping(slot_mapping, table, starts, positions, num_tokens, block_size: int, pad: int) -> None:
    pos = positions.long()
    token = torch.arange(pos.shape[0], device=pos.device)
    request = torch.bucketize(token.to(starts.dtype), starts, right=True).clamp(max=table.shape[0] - 1)
    block = table[request, (pos // block_size).clamp(0, table.shape[1] - 1)].long()
    slots = torch.where(token < num_tokens.to(pos.device), block * block_size + pos % block_size, pad)
    slot_mapping[: pos.shape[0]] = slots
    slot_mapping[pos.shape[0] :] = pad


# On tpu one program (its output buffer donated), not a dozen eager ops per step.
_write_slot_mapping_on_tpu = program(_write_slot_mapping)


def _copy_whole_buffer(buffer, n=None):
    """CpuGpuBuffer.copy_to_gpu on tpu: the whole buffer, whatever n. A write into
    a slice of a device storage is a program of that slice's shape; the whole
    buffer is one upload of a fixed shape. Rows past n are padding; async
    scheduling writes its device rows (the previous step's sampled tokens) after
    this copy."""
    buffer.gpu.copy_(buffer.cpu, non_blocking=True)
    return buffer.gpu if n is None else buffer.gpu[:n]


def _merge_sampled_tokens(input_ids, sampled, index) -> None:
    """input_ids[index[0]] = sampled[index[1], 0]: the previous step's sampled
    tokens (still on the device) as the input of the requests that go on."""
    input_ids.index_copy_(0, index[0], sampled[index[1], 0].to(input_ids.dtype))


_merge_sampled_tokens_on_tpu = program(_merge_sampled_tokens)


def allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None) -> dict:
    """vLLM's allocate_kv_cache with one storage per layer: vLLM puts every layer
    in one int8 buffer, and on tpu a write into a view rewrites its whole storage
    (storages are immutable device buffers), so each layer's KV write would copy
    every layer's cache. Each layer gets vLLM's view shape, dtype and dim order."""
    from vllm.v1.worker import utils

    # vLLM's views over a meta buffer: their shapes and strides, nothing allocated.
    with torch.device("meta"):
        views = utils.allocate_kv_cache(kv_cache_config, torch.device("meta"), layout, kernel_block_sizes)
    caches, made = {}, {}
    for name, view in views.items():
        key = (view.untyped_storage()._cdata, view.storage_offset(), tuple(view.shape), view.dtype)
        if key not in made:  # layers sharing one view share one cache
            order = sorted(range(view.dim()), key=lambda d: -view.stride(d))
            dense = torch.zeros([view.shape[d] for d in order], dtype=view.dtype, device=device)
            made[key] = dense.permute([order.index(d) for d in range(view.dim())])
        caches[name] = made[key]
    return caches


@contextlib.contextmanager
def _cuda_streams_on_tpu():
    """vLLM's async scheduling calls torch.cuda's stream API: inside, torch.tpu's.
    A tpu event waits for the work launched before its record(), host copies
    included: a non_blocking copy to pinned memory is started, not awaited, so
    the next step is scheduled and launched while the device computes this one."""
    names = ("Stream", "Event", "stream", "current_stream")
    cuda = {name: getattr(torch.cuda, name) for name in names}
    for name in names:
        setattr(torch.cuda, name, getattr(torch.tpu, name))
    try:
        yield
    finally:
        for name, value in cuda.items():
            setattr(torch.cuda, name, value)


class TpuAsyncModelRunnerOutput(runner_module.AsyncGPUModelRunnerOutput):
    def __init__(self, *args, **kwargs):
        with _cuda_streams_on_tpu():
            super().__init__(*args, **kwargs)
        # Its event keeps the next step from rewriting host buffers that a
        # non_blocking upload may still read: a copy to tpu has read its host
        # memory when it returns, so there is nothing to wait for.
        self.prepare_inputs_event = None


class TpuModelRunner(GPUModelRunner):
    def __init__(self, *args, **kwargs):
        from vllm.v1 import utils

        # This process runs vLLM on tpu only.
        utils.CpuGpuBuffer.copy_to_gpu = _copy_whole_buffer
        runner_module.AsyncGPUModelRunnerOutput = TpuAsyncModelRunnerOutput
        with _cuda_streams_on_tpu():
            super().__init__(*args, **kwargs)
        # Its event keeps the next step from rewriting host buffers that a
        # non_blocking upload may still read: a copy to tpu has read its host
        # memory when it returns, so there is nothing to wait for.
        self.prepare_inputs_event = None
        # The step's index arithmetic (positions, sequence lengths, the padding
        # mask) runs on the host, as in vLLM's CPU runner: vLLM computes it over
        # slices of the step's token and request counts, which change every
        # step, and on tpu each new shape is a program to compile. The device
        # gets these buffers whole or cut to the token bucket (fixed shapes)
        # where it reads them: slot mapping, attention metadata, the model.
        for buffer in (self.req_indices, self.query_pos, self.num_scheduled_tokens):
            buffer.gpu = buffer.cpu
        for name in ("positions", "seq_lens", "num_computed_tokens", "is_padding"):
            setattr(self, name, torch.zeros_like(getattr(self, name), device="cpu"))
        self._device_positions = torch.zeros_like(self.positions, device=self.device)
        # Input ids get a scratch row past the last token (the merge's padding
        # writes there), and the sampled tokens are kept padded to max_num_seqs
        # rows (_sample; the merge reads them whole): its shapes never change.
        self.input_ids = self._make_buffer(self.max_num_tokens + 1, dtype=torch.int32)
        self._sampled_rows = torch.zeros((self.max_num_reqs, 1), dtype=torch.int32, device=self.device)
        self._sampled = None  # the view of _sampled_rows that _sample returned last

    def _prepare_input_ids(self, scheduler_output, num_reqs, total_num_scheduled_tokens, cu_num_tokens):
        """vLLM's input ids in one program of fixed shapes, whatever the number of
        requests that go on from the previous step (vLLM's own version writes a
        slice or a scatter shaped by that number: a program per request mix):
        the host's token ids (the whole buffer), then the previous step's
        sampled tokens, still on the device, written over the last token of each
        request that goes on, by index pairs padded to max_num_seqs with pairs
        that write the scratch row. Run every step, so the preparation window
        holds the same programs whether requests go on or not."""
        # Rows past the step's tokens go to the device too: the model reads them
        # as padding, so they must hold a valid token id, not the -1 that async
        # scheduling leaves on the host for a token not read back yet.
        self.input_ids.np[total_num_scheduled_tokens:] = 0
        sampled = self.input_batch.prev_sampled_token_ids
        ours = sampled is None or sampled is self._sampled
        if not ours or self.enable_prompt_embeds or scheduler_output.scheduled_spec_decode_tokens:
            return super()._prepare_input_ids(scheduler_output, num_reqs, total_num_scheduled_tokens, cu_num_tokens)
        self.input_ids.copy_to_gpu()
        index = np.zeros((2, self.max_num_reqs), dtype=np.int64)
        index[0] = self.max_num_tokens  # the scratch row
        if sampled is not None:
            previous = self.prev_positions.np[:num_reqs]
            going_on = np.flatnonzero(previous >= 0)
            index[0, : len(going_on)] = cu_num_tokens[going_on] - 1
            index[1, : len(going_on)] = previous[going_on]
        _merge_sampled_tokens_on_tpu(self.input_ids.gpu, self._sampled_rows, torch.from_numpy(index).to(self.device))

    def _sample(self, logits, spec_decode_metadata):
        out = super()._sample(logits, spec_decode_metadata)
        ids = out.sampled_token_ids
        if spec_decode_metadata is None and ids.shape[-1] == 1:  # see _prepare_input_ids
            # A new tensor each step, not a write into the last one: whether a
            # write could donate that buffer would depend on whether its copy to
            # the host is done, and the window's program with it.
            self._sampled_rows = F.pad(ids, (0, 0, 0, self.max_num_reqs - ids.shape[0]))
            out.sampled_token_ids = self._sampled = self._sampled_rows[: ids.shape[0]]
        return out

    def _get_slot_mappings(self, num_tokens_padded, num_reqs_padded, num_tokens_unpadded, *args, **kwargs):
        # The whole buffer, whatever the step's token count (vLLM slices it to the
        # count, a new shape for every count): compute_slot_mapping already wrote
        # PAD past the step's tokens (vLLM's fill of those rows would be a program
        # per count), and attention reads the rows of its token bucket.
        rows = self.max_num_tokens
        return super()._get_slot_mappings(rows, num_reqs_padded, rows, *args, **kwargs)

    def _prepare_padding_mask(self, num_tokens_unpadded, num_tokens_padded):
        return super()._prepare_padding_mask(num_tokens_unpadded, num_tokens_padded).to(self.device)

    def _dummy_run(self, *args, **kwargs):
        positions, self.positions = self.positions, self._device_positions  # it calls the model directly
        try:
            return super()._dummy_run(*args, **kwargs)
        finally:
            self.positions = positions

    def initialize_kv_cache_tensors(self, *args, **kwargs):
        vllm_allocate = runner_module.allocate_kv_cache
        runner_module.allocate_kv_cache = allocate_kv_cache
        try:
            return super().initialize_kv_cache_tensors(*args, **kwargs)
        finally:
            runner_module.allocate_kv_cache = vllm_allocate

    def _model_forward(self, *args, **kwargs):
        # In Fused mode the model's forward (its compiled pieces, attention, KV
        # writes: shaped by the token bucket only) is one window, one program; the
        # input preparation before it and the logits and sampling after it (shaped
        # by the number of requests too) are windows of their own. In one window
        # the whole model would compile again for every bucket and request count.
        torch_tpu.mark_step()
        if kwargs.get("positions") is not None:
            kwargs["positions"] = kwargs["positions"].to(self.device)  # the token bucket's (host: see __init__)
        out = super()._model_forward(*args, **kwargs)
        torch_tpu.mark_step()
        return out

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()  # one device-to-host copy, awaited

    def _token_buckets(self) -> list[int]:
        if self.compilation_config.mode != CompilationMode.VLLM_COMPILE:
            return []
        return sorted(self.compilation_config.compile_sizes or [])

    def _determine_batch_execution_and_padding(self, num_tokens, *args, **kwargs):
        mode, descriptor, ubatch, across_dp, stats = super()._determine_batch_execution_and_padding(
            num_tokens, *args, **kwargs
        )
        buckets = self._token_buckets()
        i = bisect.bisect_left(buckets, descriptor.num_tokens)
        if i < len(buckets):  # pad to a compiled bucket: no new shape, no compile
            descriptor = BatchDescriptor(num_tokens=buckets[i])
        return CUDAGraphMode.NONE, descriptor, ubatch, across_dp, stats


def warm_up_prompt_lengths(max_num_seqs: int, max_len: int, buckets: list[int]):
    """The prefill steps warm-up runs: in every token bucket, every request count
    up to max_num_seqs (one long prompt, the others one token), and prompts of at
    most 16 tokens filling the bucket (attention's short-query programs, see
    attention.query_bucket). Each is followed by a decode step (one query token each)."""
    previous = 0
    for bucket in buckets:
        for count in range(1, min(max_num_seqs, bucket) + 1):
            first = min(bucket - count + 1, max_len - 2)  # fills the bucket; room for two sampled tokens
            yield [first] + [1] * (count - 1)
        count = min(max_num_seqs, -(-bucket // 16))
        total = min(bucket, 16 * count)
        if bucket > 16 and total > previous:
            yield [total // count + (i < total % count) for i in range(count)]
        previous = bucket


def warm_up_request_counts(runner, scheduler_config, buckets: list[int]) -> int:
    """Runs the model runner through real steps (prefill, then decode) of
    warm_up_prompt_lengths: the per-step work outside the compiled graphs (logits
    of the requests' last tokens, greedy sampling, bookkeeping) has shapes of the
    request count, attention of the query lengths, and each shape is a program
    compiled on first sight. Fake requests in blocks 1.. (block 0 is vLLM's null
    block); they are finished at the end of each step pair and never reach the
    scheduler."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    block_size = runner.cache_config.block_size
    max_len = runner.model_config.max_model_len
    blocks = runner.kv_cache_config.num_blocks
    steps = 0
    for lengths in warm_up_prompt_lengths(scheduler_config.max_num_seqs, max_len, buckets):
        count = len(lengths)
        needed = sum(-(-(n + 1) // block_size) for n in lengths)
        if needed >= blocks:
            continue
        ids, next_block, new = [f"torch_tpu-warmup-{steps}-{i}" for i in range(count)], 1, []
        for rid, n in zip(ids, lengths, strict=True):
            k = -(-(n + 1) // block_size)
            new.append(
                NewRequestData(
                    req_id=rid,
                    prompt_token_ids=[0] * n,
                    mm_features=[],
                    sampling_params=SamplingParams(temperature=0, max_tokens=2),
                    pooling_params=None,
                    block_ids=(list(range(next_block, next_block + k)),),
                    num_computed_tokens=0,
                    lora_request=None,
                )
            )
            next_block += k
        prefill = SchedulerOutput.make_empty()
        prefill.scheduled_new_reqs = new
        prefill.num_scheduled_tokens = dict(zip(ids, lengths, strict=True))
        prefill.total_num_scheduled_tokens = sum(lengths)
        decode = SchedulerOutput.make_empty()
        decode.scheduled_cached_reqs = CachedRequestData(
            req_ids=ids,
            resumed_req_ids=set(),
            new_token_ids=[[] for _ in ids],
            all_token_ids={},
            new_block_ids=[None for _ in ids],
            num_computed_tokens=lengths,
            num_output_tokens=[1 for _ in ids],
        )
        decode.num_scheduled_tokens = {rid: 1 for rid in ids}
        decode.total_num_scheduled_tokens = count
        finish = SchedulerOutput.make_empty()
        finish.finished_req_ids = set(ids)
        for step in (prefill, decode):
            runner.execute_model(step)
            runner.sample_tokens(None)
            steps += 1
        runner.execute_model(finish)
    return steps


class TpuWorker(Worker):
    def init_device(self):
        if "TORCH_TPU_EAGER_MODE" not in os.environ:
            # The per-step work around the compiled pieces (or every op, with
            # enforce_eager) in fused windows: fewer, larger programs per step
            # (benchmarks/vllm_serve.py: 1.3x Strict's throughput).
            torch_tpu.set_eager_mode("fused")
        torch.tpu.set_device(self.local_rank)
        self.device = torch.device("tpu", self.local_rank)
        init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank, "gloo"
        )
        from vllm.utils.torch_utils import set_random_seed

        set_random_seed(self.model_config.seed)
        gc.collect()
        self._init_workspace_and_model_runner()

    def _make_model_runner(self):
        return TpuModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str):
        return contextlib.nullcontext()  # no sleep mode: nothing to tag

    def sleep(self, level: int = 1) -> None:
        logger.warning("torch_tpu's vLLM worker: sleep mode is not supported; ignored")

    def wake_up(self, tags=None) -> None:
        pass

    def determine_available_memory(self) -> int:
        """KV cache bytes: what was asked for, else the device's free memory after a
        profile run (the largest batch, which compiles it) times gpu_memory_utilization,
        less what the run's peak took beyond its start."""
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        start = torch.tpu.memory_allocated()
        self.model_runner.profile_run()
        torch.tpu.synchronize()
        activations = torch.tpu.max_memory_allocated() - start
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            return int(explicit)
        free, total = torch.tpu.mem_get_info()
        budget = int(total * self.cache_config.gpu_memory_utilization) - (total - free) - activations
        if budget <= 0:
            raise ValueError(
                f"torch_tpu's vLLM worker: no device memory left for the KV cache ({free} of {total} bytes free, "
                f"{activations} taken by activations): raise gpu_memory_utilization or set kv_cache_memory_bytes"
            )
        return budget

    def compile_or_warm_up_model(self) -> CompilationTimes:
        """Compiles every token bucket now (largest first), then runs real steps of
        every request count in every bucket, so serving compiles nothing."""
        buckets = sorted(self.model_runner._token_buckets(), reverse=True)
        for size in buckets:
            logger.info("torch_tpu: compiling the %d-token step", size)
            self.model_runner._dummy_run(size, force_attention=True, skip_eplb=True, remove_lora=False)
        if buckets:
            start = time.perf_counter()
            steps = warm_up_request_counts(self.model_runner, self.scheduler_config, sorted(buckets))
            logger.info("torch_tpu: warmed up %d steps in %.1f s", steps, time.perf_counter() - start)
        from vllm.utils.torch_utils import set_random_seed

        set_random_seed(self.model_config.seed)
        return CompilationTimes(
            language_model=self.compilation_config.compilation_time,
            encoder=getattr(self.compilation_config, "encoder_compilation_time", 0.0),
        )
