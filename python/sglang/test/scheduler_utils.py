"""Driving a `Scheduler` in-process in tests: build it, submit greedy requests, run, check leaks."""

from __future__ import annotations

import random
from typing import List, Sequence

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

MAX_STEPS = 5000


def make_scheduler(model_dir: str, **server_args) -> Scheduler:
    args = dict(model_path=model_dir, dtype="float32", skip_server_warmup=True)
    args.update(server_args)
    return Scheduler(ServerArgs(**args))


def submit(sched: Scheduler, rid: str, ids: List[int], max_new_tokens: int, **sampling):
    """A greedy request that never stops early (the HF reference runs the same number of tokens)."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, **sampling)
    params.normalize(None)
    return sched.add_request(TokenizedGenerateReqInput(rid=rid, input_text=None, input_ids=ids, sampling_params=params))


def run_to_completion(sched: Scheduler, max_steps: int = MAX_STEPS) -> None:
    for _ in range(max_steps):
        if not sched.has_work():
            return
        sched.step()
    raise AssertionError("scheduler did not finish within the step bound")


def random_prompts(lengths: Sequence[int], seed: int, vocab_hi: int = 49000) -> List[List[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab_hi) for _ in range(n)] for n in lengths]


def assert_no_leak(sched: Scheduler) -> None:
    """No request holds anything: after evicting the whole tree every pool is back to its size."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import EvictParams

    cache = sched.memory.tree_cache
    assert cache.protected_size() == 0
    cache.evict(EvictParams(num_tokens=sched.memory.init_free_kv, swa_num_tokens=sched.memory.init_free_kv,
                            mamba_num=sched.memory.init_free_kv))
    assert cache.evictable_size() == 0
    assert sched.memory.allocator.available_size() == sched.memory.init_free_kv
    assert sched.memory.req_to_token_pool.available_size() == sched.memory.req_to_token_pool.size
    if sched.memory.mamba_pool is not None:
        assert cache.component_protected_size(ComponentType.MAMBA) == 0
        assert sched.memory.mamba_pool.available_size() == sched.memory.mamba_pool.size
    store = sched.memory.retraction_store
    if store is not None:
        assert store.num_live == 0
        if store.host_pool is not None:
            assert store.host_pool.available_size() == store.host_pool.size
        if store.host_mamba_pool is not None:
            assert store.host_mamba_pool.available_size() == store.host_mamba_pool.size


class InProcessPD:
    """A prefill and a decode `Scheduler` in this process with their own bootstrap server,
    exchanging KV (and Mamba state) over the real Mooncake engine (TCP on loopback)."""

    def __init__(self, model_dir: str, decode_kw=None, **common_kw):
        from sglang.srt.disaggregation.bootstrap_server import KVBootstrapServer
        from sglang.srt.utils import get_free_port

        self.port = get_free_port()
        self.server = KVBootstrapServer("127.0.0.1", self.port)
        common = dict(model_path=model_dir, dtype="float32", max_total_tokens=1024, page_size=1,
                      chunked_prefill_size=16, host="127.0.0.1", disaggregation_transfer_backend="mooncake_tcp",
                      disaggregation_bootstrap_port=self.port, max_running_requests=8)
        common.update(common_kw)
        self.prefill = Scheduler(ServerArgs(disaggregation_mode="prefill", **common))
        self.decode = Scheduler(ServerArgs(disaggregation_mode="decode", **{**common, **(decode_kw or {})}))

    def request(self, rid: str, ids: List[int], max_new_tokens: int, room: int, stream: bool = False):
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
        params.normalize(None)
        return TokenizedGenerateReqInput(rid=rid, input_text=None, input_ids=ids, sampling_params=params,
                                         bootstrap_host="127.0.0.1", bootstrap_port=self.port,
                                         bootstrap_room=room, stream=stream)

    def run(self, prompts: Sequence[List[int]], max_new_tokens: int, room0: int = 7000, on_step=None,
            stream: bool = False, timeout: float = 60.0):
        """Sends each prompt to both sides (as the router does) and steps both until the decode side
        is done; returns the decode side's requests."""
        import time

        dreqs = []
        for i, ids in enumerate(prompts):
            self.prefill.add_request(self.request(f"p{room0 + i}", ids, max_new_tokens, room0 + i, stream))
            dreqs.append(self.decode.add_request(self.request(f"d{room0 + i}", ids, max_new_tokens, room0 + i, stream)))
        deadline = time.monotonic() + timeout
        while (self.prefill.has_work() or self.decode.has_work()) and time.monotonic() < deadline:
            self.prefill.step()
            outs = self.decode.step()
            if self.decode.send_outputs is not None:
                self.decode.send_outputs(outs)
            if on_step is not None:
                on_step()
            time.sleep(0.001)
        assert not self.decode.has_work(), "PD pair did not finish"
        return dreqs

    def close(self) -> None:
        self.prefill.close()
        self.decode.close()
        self.server.close()
