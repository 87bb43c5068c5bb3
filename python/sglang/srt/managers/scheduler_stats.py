"""(Scheduler process.) What the scheduler tells the outside about itself: upstream's periodic
log lines ("Prefill batch. ...", "Decode batch. #running-req: N, ..." every
`--decode-log-interval` decode steps; upstream's tools parse them), the start-up info, and the
internal state that `/server_info` and `/metrics` read.

A mixin of `Scheduler`; kept apart so that `scheduler.py` is about batching.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("sglang.srt.managers.scheduler")


class SchedulerStatsMixin:
    def init_stats(self) -> None:
        self.num_generated_tokens = 0
        self.decode_steps_since_log = 0
        self.last_decode_log_time = time.perf_counter()
        self.last_gen_throughput = 0.0

    def log_prefill_stats(self, reqs, adder) -> None:
        new_tokens = sum(r.extend_input_len for r in reqs)
        cached = sum(len(r.prefix_indices) for r in reqs)
        _, usage = self.memory.token_usage()
        msg = (f"Prefill batch. #new-seq: {len(reqs)}, #new-token: {new_tokens}, #cached-token: {cached}, "
               f"token usage: {usage:.2f}, #running-req: {len(self.running_reqs)}, "
               f"#queue-req: {len(self.waiting_queue)}, {self.role.log_fields(decode=False)}")
        graph = "cpu graph" if self.device == "cpu" else "cuda graph"
        logger.info(msg + f"{graph}: False")

    def log_decode_stats(self) -> None:
        self.decode_steps_since_log += 1
        interval = max(int(self.server_args.decode_log_interval or 1), 1)
        if self.decode_steps_since_log % interval:
            return
        now = time.perf_counter()
        gap = max(now - self.last_decode_log_time, 1e-9)
        self.last_gen_throughput = self.num_generated_tokens / gap
        self.num_generated_tokens = 0
        self.last_decode_log_time = now
        used, usage = self.memory.token_usage()
        msg = (f"Decode batch. #running-req: {len(self.running_reqs)}, #token: {used}, token usage: {usage:.2f}, "
               f"{self.role.log_fields(decode=True)}")
        graph = "cpu graph" if self.device == "cpu" else "cuda graph"
        logger.info(msg + f"{graph}: False, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
                    f"#queue-req: {len(self.waiting_queue)}")

    # --- introspection -----------------------------------------------------------------------------
    def flush_cache(self) -> bool:
        if self.has_work():
            return False
        self.memory.flush()
        return True

    def ready_info(self) -> dict:
        """What the tokenizer manager learns once the scheduler is up (server_info, limits)."""
        return {
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "max_req_input_len": self.max_req_input_len,
            "context_len": self.model_config.context_len,
            "vocab_size": self.model_config.vocab_size,
            "model_path": self.model_config.model_path,
            "architecture": self.model_config.architecture,
            "page_size": self.page_size,
            **self.embedding_info(),
        }

    def embedding_info(self) -> dict:
        """Embedding servers: what `/v1/embeddings` and `/v1/rerank` check (vector size, pooling,
        matryoshka dimensions from config.json, as upstream)."""
        if self.pooling is None:
            return {}
        from sglang.srt.configs.model_config import num_labels_of

        hf = self.model_config.hf_config
        return {
            "is_classifier": self.pooling.classifier,
            "pooling_type": self.pooling.pooling_type,
            "embedding_normalize": self.pooling.normalize,
            "embedding_dim": num_labels_of(hf) if self.pooling.classifier else self.model_config.hidden_size,
            "is_matryoshka": bool(hf.get("is_matryoshka") or hf.get("matryoshka_dimensions")),
            "matryoshka_dimensions": hf.get("matryoshka_dimensions"),
        }

    def internal_state(self) -> dict:
        """`/server_info` and `/metrics`: queues, the memory manager's accounting, the role's queues."""
        return {
            "num_waiting_reqs": len(self.waiting_queue),
            "num_running_reqs": len(self.running_reqs),
            "num_grammar_queue_reqs": len(self.grammar_manager.queue) if self.grammar_manager is not None else 0,
            **self.memory.stats(),
            "max_running_requests": self.max_running_requests,
            "num_retracted_reqs_total": self.num_retracted_total,
            "num_recomputed_tokens": self.num_recomputed_tokens,
            "new_token_ratio": self.new_token_ratio,
            "forward_ct": self.forward_ct,
            "num_mixed_batches": self.num_mixed_batches,
            "disaggregation": {"mode": self.role.mode, **self.role.stats()},
        }
