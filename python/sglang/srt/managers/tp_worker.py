"""(Scheduler process.) The worker seam: the scheduler plans a batch, a worker runs it.

    worker = TpModelWorker(server_args)             # loads the model
    memory = build_memory(worker.memory_spec(), ...)  # the scheduler builds memory ...
    worker.attach_memory(memory)                      # ... and hands the pools to the worker
    result = worker.forward_batch_generation(batch)  # forward + sample -> GenerationBatchResult

`ModelWorker` is the interface the scheduler sees. `TpModelWorker` (upstream's name) is the plain
worker: one process, one model (under tensor parallelism: this rank's shards). The TP rank-0
worker (`tp_group_worker.py` TpGroupWorker: sends each planned batch to the other ranks, which
run the same forward; `tp_group_worker.make_worker` picks it) and a speculative worker (draft, then verify with
the target worker) are alternatives behind the same four calls; a multi-LoRA batch carries its adapter
segments in `WorkerBatch`. The worker never sees requests, queues or memory accounting: only the
`ForwardBatch` and what sampling needs.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import List, Optional, Sequence

import torch


@dataclasses.dataclass
class WorkerBatch:
    """One planned forward (upstream: ModelWorkerBatch). `sample_rows`: the rows of the batch's
    next-token logits that sample a token (None: every row, in order; [] none, e.g. a prompt chunk).
    The per-sampled-row fields follow `sample_rows`' order."""

    forward_batch: object  # model_executor/forward_batch.py ForwardBatch
    sampling_info: object = None  # sampling/sampling_batch_info.py SamplingBatchInfo of the sampled rows
    sample_rows: Optional[List[int]] = None
    return_logprob: bool = False
    top_logprobs_nums: Sequence[int] = ()
    token_ids_logprobs: Optional[Sequence[Optional[List[int]]]] = None
    # Speculative verification (an EXTEND forward of each request's last token and its drafts):
    # per request the drafted tokens; `sampling_info` and the logprob asks then have one row
    # per scored position (k_i + 1 per request). None: a plain batch.
    drafts: Optional[List[List[int]]] = None


@dataclasses.dataclass
class GenerationBatchResult:
    """What a worker returns for a planned batch (upstream's name). `logits_output` keeps what
    output processing reads beyond the tokens: full logits (prompt logprobs) and hidden states
    (pooling). `logprobs`: the sampler's output when a sampled row asked for logprobs, else None."""

    logits_output: object  # layers/logits_processor.py LogitsProcessorOutput
    next_token_ids: List[int]
    logprobs: object = None  # layers/sampler.py SamplerOutput
    # Speculative verification: per request the emitted tokens (accepted drafts, then the
    # target's next one) and how many drafts were accepted; `logprobs` then has one row per
    # emitted token, in order. None for a plain batch.
    spec_tokens: Optional[List[List[int]]] = None
    spec_accepted: Optional[List[int]] = None


@dataclasses.dataclass
class TpPlacement:
    """One tensor-parallel rank of one replica: its rank and group size, the address of the
    group's TCP store (`host:port`, rank 0 serves it), and the CPU cores it is bound to (None:
    the process keeps the cores it started with). `local_rank`: its index on this node."""

    rank: int = 0
    size: int = 1
    init_addr: str = ""
    cores: Optional[List[int]] = None
    local_rank: int = 0


class ModelWorker(abc.ABC):
    """The one interface behind which plain, TP rank-0 and speculative workers are alternatives."""

    forward_ct: int = 0  # forwards run so far

    @abc.abstractmethod
    def memory_spec(self):
        """What the loaded model needs of memory (`mem_cache.memory_manager.ModelMemorySpec`)."""

    @abc.abstractmethod
    def attach_memory(self, memory) -> None:
        """Receives the pools the scheduler built for this model."""

    @abc.abstractmethod
    def forward_batch_generation(self, batch: WorkerBatch) -> GenerationBatchResult:
        """Runs the forward, then samples the rows the batch says."""

    @abc.abstractmethod
    def forward_batch_embedding(self, forward_batch):
        """Runs the forward of an embedding server's batch (no sampling): LogitsProcessorOutput."""

    def keep_alive(self) -> None:
        """Called every turn of the scheduler loop, busy or idle (a TP rank 0 tells the other
        ranks it is alive, managers/tp_group_worker.py); nothing for a single process."""


class TpModelWorker(ModelWorker):
    """The plain worker: the `ModelRunner` and the `Sampler` of this process."""

    def __init__(self, server_args, placement: Optional[TpPlacement] = None):
        """Under TP (`placement.size` > 1) this process joins its group first (the layers shard
        as they are built), loads its shards, and the ranks agree on one KV token count (the
        smallest any rank can hold: every rank's pool holds its heads of the same slots)."""
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.distributed.parallel_state import init_tp_group
        from sglang.srt.layers.sampler import Sampler
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.model_loader.default_model import resolve_model_path

        sa = server_args
        self.placement = placement or TpPlacement()
        if self.placement.size > 1:
            init_tp_group(self.placement.rank, self.placement.size, self.placement.init_addr,
                          device=sa.device or "cpu", init_timeout_s=sa.dist_timeout)
        model_config = ModelConfig.from_path(resolve_model_path(sa.model_path, sa.load_format), sa.context_length)
        self.model_runner = ModelRunner(model_config, sa, build_memory=False)  # loads the weights
        self.model_config = self.model_runner.model_config
        self.device = self.model_runner.device
        # --is-embedding: how the last hidden states are pooled (None for generation servers).
        self.pooling = self.model_runner.pooling_config if sa.is_embedding else None
        self.sampler = Sampler()
        self.forward_ct = 0
        self.agreed_max_total_tokens = None
        if self.placement.size > 1 and sa.max_total_tokens is None:
            from sglang.srt.configs.runtime_config import MemoryConfig
            from sglang.srt.distributed.parallel_state import all_reduce_min
            from sglang.srt.mem_cache.memory_manager import profile_max_num_tokens

            runner = self.model_runner
            mine = profile_max_num_tokens(runner.model_config, runner.kv_cache_dtype,
                                          MemoryConfig.from_server_args(sa), runner.device)
            self.agreed_max_total_tokens = all_reduce_min(mine)

    def memory_spec(self):
        spec = self.model_runner.memory_spec()
        if self.agreed_max_total_tokens is not None:
            spec = dataclasses.replace(spec, max_total_tokens=self.agreed_max_total_tokens)
        return spec

    def attach_memory(self, memory) -> None:
        self.model_runner.attach_memory(memory)

    def _forward(self, forward_batch):
        try:
            return self.model_runner.forward(forward_batch)
        finally:
            self.forward_ct += 1

    def forward_batch_embedding(self, forward_batch):
        return self._forward(forward_batch)

    def forward_batch_generation(self, batch: WorkerBatch) -> GenerationBatchResult:
        logits_output = self._forward(batch.forward_batch)
        if logits_output.next_token_ids is not None:  # the LM head took the argmax itself
            return GenerationBatchResult(logits_output, logits_output.next_token_ids.tolist())
        logits = logits_output.next_token_logits
        rows = batch.sample_rows
        if rows is not None:
            if not rows:
                return GenerationBatchResult(logits_output, [])
            if len(rows) < logits.shape[0]:  # rows ascend from 0: all of them means no copy of [rows, vocab]
                logits = logits.index_select(0, torch.tensor(rows, dtype=torch.int64, device=logits.device))
        ids = batch.token_ids_logprobs
        out = self.sampler.forward(logits, batch.sampling_info, batch.return_logprob, list(batch.top_logprobs_nums),
                                   ids if ids is not None and any(t is not None for t in ids) else None)
        return GenerationBatchResult(logits_output, out.next_token_ids.tolist(),
                                     out if batch.return_logprob else None)
