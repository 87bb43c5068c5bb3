"""The offline engine: `sglang.Engine(model_path=..., **server_args)`.

Runs the same processes as the HTTP server (scheduler and detokenizer subprocesses, the
TokenizerManager here) and drives the TokenizerManager on a private event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
from typing import Any, Dict, Iterator, List, Optional, Union

from sglang.srt.managers.io_struct import GenerateReqInput

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, **kwargs):
        from sglang.srt.entrypoints.launch import launch_engine_processes
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.server_args.compat import warn_no_effect_flags
        from sglang.srt.utils.process import configure_logging

        server_args = kwargs.pop("server_args", None)
        if server_args is None:
            kwargs.setdefault("log_level", "error")
            server_args = ServerArgs.from_kwargs(**kwargs)
        self.server_args = server_args
        configure_logging(server_args)
        warn_no_effect_flags(server_args)
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self._procs = launch_engine_processes(server_args)
        self.tokenizer_manager = self._procs.tokenizer_manager
        atexit.register(self.shutdown)

    def generate(
        self,
        prompt: Optional[Union[List[str], str]] = None,
        sampling_params: Optional[Union[List[Dict], Dict]] = None,
        input_ids: Optional[Union[List[List[int]], List[int]]] = None,
        return_logprob: Optional[Union[List[bool], bool]] = False,
        logprob_start_len: Optional[Union[List[int], int]] = None,
        top_logprobs_num: Optional[Union[List[int], int]] = None,
        return_text_in_logprobs: bool = False,
        stream: bool = False,
        rid: Optional[Union[List[str], str]] = None,
        bootstrap_host=None,
        bootstrap_port=None,
        bootstrap_room=None,
        priority: Optional[int] = None,
        extra_key=None,
        cache_salt=None,
        **unused: Any,
    ):
        obj = GenerateReqInput(
            text=prompt, input_ids=input_ids, sampling_params=sampling_params, return_logprob=return_logprob,
            logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs, stream=stream, rid=rid,
            bootstrap_host=bootstrap_host, bootstrap_port=bootstrap_port, bootstrap_room=bootstrap_room,
            priority=priority, extra_key=extra_key, cache_salt=cache_salt,
        )
        gen = self.tokenizer_manager.generate_request(obj, None)
        if stream:
            return self._iterate(gen)
        return self.loop.run_until_complete(gen.__anext__())

    def _iterate(self, agen) -> Iterator[dict]:
        while True:
            try:
                yield self.loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, stream: bool = False, **kwargs):
        obj = GenerateReqInput(text=prompt, input_ids=input_ids, sampling_params=sampling_params, stream=stream,
                               **{k: v for k, v in kwargs.items() if k in GenerateReqInput.__dataclass_fields__})
        gen = self.tokenizer_manager.generate_request(obj, None)
        if stream:
            return gen
        return await gen.__anext__()

    def encode(self, prompt: Optional[Union[List[str], str, List[int], List[List[int]]]] = None, **unused: Any):
        """Embedding servers (`is_embedding=True`): `{"embedding", "meta_info"}` for one prompt, a
        list for a batch (text, or token ids)."""
        from sglang.srt.managers.io_struct import EmbeddingReqInput

        is_ids = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], str)
        obj = EmbeddingReqInput(input_ids=prompt) if is_ids else EmbeddingReqInput(text=prompt)
        return self.loop.run_until_complete(self.tokenizer_manager.generate_request(obj, None).__anext__())

    def score(self, query=None, items=None, label_token_ids=None, apply_softmax: bool = False,
              item_first: bool = False) -> List[List[float]]:
        """Upstream's `Engine.score`: per item, the probabilities of `label_token_ids` right after
        `query + item` (`managers/scoring.py`)."""
        from sglang.srt.managers.scoring import score_request

        result = self.loop.run_until_complete(score_request(self.tokenizer_manager, query, items, label_token_ids,
                                                            apply_softmax, item_first))
        return result.scores

    def flush_cache(self):
        return self.loop.run_until_complete(self.tokenizer_manager.flush_cache())

    def get_server_info(self) -> Dict[str, Any]:
        states = self.loop.run_until_complete(self.tokenizer_manager.get_internal_states())
        return {
            **self.server_args.resolved_dict(),
            **self._procs.scheduler_info,
            "internal_states": states,  # one per scheduler replica (dp_size)
            "version": __import__("sglang").__version__,
        }

    def shutdown(self) -> None:
        task = getattr(getattr(self, "tokenizer_manager", None), "handle_loop_task", None)
        if task is not None and not task.done() and not self.loop.is_closed():
            task.cancel()
            try:
                self.loop.run_until_complete(task)
            except BaseException:  # CancelledError: the loop task is gone, which is what we want
                pass
        procs = getattr(self, "_procs", None)
        if procs is not None:
            procs.shutdown()
            self._procs = None
            self.tokenizer_manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
