"""(Scheduler process, and each other TP rank's process.) Tensor parallelism as upstream does it:
rank 0's scheduler receives the requests and plans every batch; the other ranks receive the
planned batch and run the same forward on their shards.

    rank 0:  Scheduler -> TpGroupWorker.forward_batch_generation(batch)
                 1. sends the plan (below) to the other ranks
                 2. runs its own forward (the layers' all-reduces / all-gathers meet the others')
                 3. samples: only rank 0 samples. The other ranks need no tokens: the next
                    batch's input ids come in the next plan, so sampling cannot diverge.
    rank r:  run_tp_follower_process -> TpFollower.run(): receive a plan, rebuild the
             ForwardBatch, write the request rows it uses into its own req_to_token pool,
             run the forward, discard the logits.

The plan is the ForwardBatch's tensors and lists plus, for a prompt, the KV slots of its cached
prefix (rank 0's radix tree found them; every rank wrote the same slots, each with its heads).
It is encoded by the internal msgpack codec (managers/internal_channel.py: signed with
SGLANG_INTERNAL_SECRET when it is set, never pickle, also across hosts) into a byte tensor that
torch.distributed broadcasts (distributed/parallel_state.py broadcast_bytes_from_rank0).

Faults: a collective that fails or times out (a rank died or hung; SGLANG_TP_COLLECTIVE_TIMEOUT)
raises TpPeerError, which is fatal on every rank: the scheduler loop does not contain it, the
process exits non-zero and its launcher takes the server down. So that an idle rank 0 notices a
dead peer too, and an idle follower a dead rank 0, rank 0 sends a keep-alive at least once a
second (`keep_alive`, every turn of the scheduler loop). A forward that raises on rank 0 is fatal
too: the other ranks are inside the same forward's collectives and cannot be brought back in step.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from sglang.srt.distributed.parallel_state import TpPeerError, broadcast_bytes_from_rank0
from sglang.srt.managers.tp_worker import GenerationBatchResult, ModelWorker, TpModelWorker, TpPlacement, WorkerBatch
from sglang.srt.model_executor.forward_batch import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)

PLAN, KEEP_ALIVE, STOP = 1, 2, 3
KEEP_ALIVE_INTERVAL_S = 1.0

_TENSORS = ("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc")
_LISTS = ("seq_lens_cpu", "extend_prefix_lens_cpu", "extend_seq_lens_cpu")
_FLAGS = ("return_full_logits", "return_all_hidden", "argmax_only")


def encode_plan(fb: ForwardBatch, req_to_token: torch.Tensor) -> bytes:
    """The msgpack frame of one planned forward (see the module doc)."""
    from sglang.srt.managers.internal_channel import internal_codec

    prefix = torch.empty(0, dtype=torch.int64)
    if fb.forward_mode.is_extend() and any(fb.extend_prefix_lens_cpu):
        rows = fb.req_pool_indices.tolist()
        prefix = torch.cat([req_to_token[r, :p].cpu() for r, p in zip(rows, fb.extend_prefix_lens_cpu)])
    plan = {"mode": int(fb.forward_mode), "batch_size": int(fb.batch_size), "prefix_slots": prefix}
    plan.update({name: getattr(fb, name).cpu() for name in _TENSORS})
    plan.update({name: [int(x) for x in getattr(fb, name)] for name in _LISTS})
    plan.update({name: bool(getattr(fb, name, False)) for name in _FLAGS})
    return internal_codec().encode(plan)


def decode_plan(frame: bytes, device: str, req_to_token: torch.Tensor) -> ForwardBatch:
    """Rebuilds the ForwardBatch and writes the request rows it reads (prefix slots, then the new
    tokens' slots) into this rank's req_to_token, as rank 0's memory manager did in its own."""
    from sglang.srt.managers.internal_channel import internal_codec

    plan = internal_codec().decode(frame)
    if not isinstance(plan, dict):
        raise TpPeerError(f"a batch plan that is not a plan: {type(plan).__name__}")
    fb = ForwardBatch(forward_mode=ForwardMode(plan["mode"]), batch_size=plan["batch_size"],
                      **{name: plan[name].to(device) for name in _TENSORS},
                      **{name: plan[name] for name in _LISTS + _FLAGS})
    seq = fb.seq_lens_cpu
    ext = fb.extend_seq_lens_cpu or [1] * len(seq)
    pre = fb.extend_prefix_lens_cpu or [s - 1 for s in seq]
    rows = fb.req_pool_indices.tolist()
    out, prefix = fb.out_cache_loc.to(req_to_token.device), plan["prefix_slots"].to(req_to_token.device)
    at_out = at_prefix = 0
    for row, p, n in zip(rows, pre, ext):
        if fb.forward_mode.is_extend() and p:
            req_to_token[row, :p] = prefix[at_prefix:at_prefix + p]
            at_prefix += p
        req_to_token[row, p:p + n] = out[at_out:at_out + n]
        at_out += n
    return fb


class TpGroupWorker(ModelWorker):
    """Rank 0's worker under tensor parallelism: the plain worker on its shards, which first sends
    each planned batch to the other ranks."""

    def __init__(self, server_args, placement: TpPlacement):
        self.inner = TpModelWorker(server_args, placement)
        self.model_runner = self.inner.model_runner
        self.model_config = self.inner.model_config
        self.device = self.inner.device
        self.pooling = self.inner.pooling
        self.last_sent = time.monotonic()

    @property
    def forward_ct(self) -> int:
        return self.inner.forward_ct

    def memory_spec(self):
        return self.inner.memory_spec()

    def attach_memory(self, memory) -> None:
        self.inner.attach_memory(memory)

    def _send(self, header: int, payload: Optional[bytes] = None) -> None:
        broadcast_bytes_from_rank0(payload, header)
        self.last_sent = time.monotonic()

    def _in_step(self, forward_batch, run):
        self._send(PLAN, encode_plan(forward_batch, self.model_runner.pools.req_to_token_pool.req_to_token))
        try:
            return run()
        except TpPeerError:
            raise
        except Exception as e:  # noqa: BLE001 - the other ranks are in this forward: no way back in step
            raise TpPeerError(f"TP rank 0: the forward failed ({type(e).__name__}: {e}); the ranks are out "
                              "of step") from e

    def forward_batch_generation(self, batch: WorkerBatch) -> GenerationBatchResult:
        return self._in_step(batch.forward_batch, lambda: self.inner.forward_batch_generation(batch))

    def forward_batch_embedding(self, forward_batch):
        return self._in_step(forward_batch, lambda: self.inner.forward_batch_embedding(forward_batch))

    def keep_alive(self) -> None:
        if time.monotonic() - self.last_sent >= KEEP_ALIVE_INTERVAL_S:
            self._send(KEEP_ALIVE)

    def stop_followers(self) -> None:
        """Tells the other ranks to exit (a clean shutdown); best effort."""
        try:
            self._send(STOP)
        except TpPeerError:
            pass


def make_worker(server_args, placement: Optional[TpPlacement] = None) -> ModelWorker:
    """The plain worker, or under TP rank 0's worker (it sends each planned batch to the other
    ranks, which run the same forward on their shards)."""
    if placement is not None and placement.size > 1:
        return TpGroupWorker(server_args, placement)
    return TpModelWorker(server_args, placement)


class TpFollower:
    """A rank other than 0: runs each plan rank 0 sends, until STOP."""

    def __init__(self, server_args, placement: TpPlacement):
        from sglang.srt.configs.runtime_config import MemoryConfig
        from sglang.srt.mem_cache.memory_manager import build_memory

        self.worker = TpModelWorker(server_args, placement)
        # Pools only: the requests, the radix tree and the accounting live on rank 0.
        self.worker.attach_memory(build_memory(self.worker.memory_spec(), MemoryConfig.from_server_args(server_args)))
        self.rank = placement.rank

    def run(self) -> None:
        req_to_token = self.worker.model_runner.pools.req_to_token_pool.req_to_token
        device = self.worker.device
        while True:
            header, payload = broadcast_bytes_from_rank0(None)
            if header == KEEP_ALIVE:
                continue
            if header == STOP:
                logger.info(f"TP rank {self.rank}: rank 0 stopped the group")
                return
            if header != PLAN:
                raise TpPeerError(f"TP rank {self.rank}: unknown control code {header} from rank 0")
            fb = decode_plan(payload, device, req_to_token)
            self.worker.forward_batch_embedding(fb)  # the forward only: rank 0 samples


def run_tp_follower_process(server_args, placement: TpPlacement, ready_pipe, notify_parent: bool = False) -> None:
    """A TP rank other than 0, in its own process (started by entrypoints/launch.py start_tp_ranks).
    Exits 0 when rank 0 stops the group, non-zero (after telling a server parent with SIGQUIT)
    when anything fails."""
    import signal
    import traceback

    from sglang.srt.utils.process import configure_subprocess, notify_parent_and_exit

    configure_subprocess(f"TP{placement.rank}", server_args, torch_threads=0)
    # A rank blocked in a collective could not run a Python handler: it leaves when rank 0 says
    # STOP (rank 0's own shutdown), when rank 0 is gone (its collectives fail), or by SIGKILL.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        if server_args.device == "cpu":
            from sglang.srt.utils.cpu_binding import bind_to_cores

            logger.info(bind_to_cores(placement.cores))
        follower = TpFollower(server_args, placement)
        ready_pipe.send({"ready": True, "tp_rank": placement.rank})
    except Exception as e:  # noqa: BLE001 - reported to the launcher, which names it
        logger.error(f"TP rank {placement.rank} failed to start:\n{traceback.format_exc()}")
        ready_pipe.send({"error": f"TP rank {placement.rank}: {type(e).__name__}: {e}"})
        notify_parent_and_exit(1, False)
        return
    try:
        follower.run()
    except BaseException as e:  # noqa: BLE001 - fatal: say so, tell the parent, exit non-zero
        logger.error(f"TP rank {placement.rank} is leaving the group: {type(e).__name__}: {e}")
        notify_parent_and_exit(1, notify_parent)
    from sglang.srt.utils.process import exit_after_cleanup

    exit_after_cleanup(0)
