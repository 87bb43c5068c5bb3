"""(Scheduler process.) What the scheduler tells the outside about itself: upstream's periodic
log lines ("Prefill batch. ...", "Decode batch. #running-req: N, ..." every
`--decode-log-interval` decode steps; upstream's tools parse them) and the counters that
`/server_info` and `/metrics` read (`Scheduler.internal_state`).

`SchedulerStats` owns the counters; every input of a log line is an argument.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("sglang.srt.managers.scheduler")


class SchedulerStats:
    def __init__(self, device: str, decode_log_interval):
        self.graph = "cpu graph" if device == "cpu" else "cuda graph"
        self.decode_log_interval = max(int(decode_log_interval or 1), 1)
        self.num_generated_tokens = 0  # since the last decode log line
        self.decode_steps_since_log = 0
        self.last_decode_log_time = time.perf_counter()
        self.last_gen_throughput = 0.0
        self.num_retracted_total = 0
        self.num_recomputed_tokens = 0  # prompt tokens prefilled again after a retraction
        self.num_mixed_batches = 0  # prefill batches that carried decode tokens (--enable-mixed-chunk)
        # Speculative decoding (upstream's accept length / rate): request-steps, tokens they
        # emitted, drafted tokens and accepted ones; totals and since the last decode log line.
        self.speculative = False
        self.spec_totals = [0, 0, 0, 0]
        self.spec_window = [0, 0, 0, 0]
        self.last_spec_accept_length = 0.0
        self.last_spec_accept_rate = 0.0

    def record_verify(self, emitted: int, proposed: int, accepted: int) -> None:
        """One request's speculative decode step: tokens it emitted, drafted, accepted."""
        for acc in (self.spec_totals, self.spec_window):
            acc[0] += 1
            acc[1] += emitted
            acc[2] += proposed
            acc[3] += accepted

    def spec_info(self) -> dict:
        """/server_info and /metrics: the last log interval's accept length (tokens a request
        emits per verify step, bonus included) and rate (accepted / drafted), and the totals."""
        if not self.speculative:
            return {}
        steps, emitted, proposed, accepted = self.spec_totals
        return {
            "spec_accept_length": self.last_spec_accept_length,
            "spec_accept_rate": self.last_spec_accept_rate,
            "spec_verify_ct_total": steps,
            "spec_num_proposed_drafts_total": proposed,
            "spec_num_correct_drafts_total": accepted,
            "avg_spec_accept_length": emitted / steps if steps else 0.0,
        }

    def log_prefill(self, reqs, queues, memory, role) -> None:
        new_tokens = sum(r.extend_input_len for r in reqs)
        cached = sum(len(r.kv.prefix_indices) for r in reqs)
        _, usage = memory.token_usage()
        msg = (f"Prefill batch. #new-seq: {len(reqs)}, #new-token: {new_tokens}, #cached-token: {cached}, "
               f"token usage: {usage:.2f}, #running-req: {len(queues.running)}, "
               f"#queue-req: {len(queues.waiting)}, {role.log_fields(decode=False)}")
        logger.info(msg + f"{self.graph}: False")

    def log_decode(self, queues, memory, role) -> None:
        self.decode_steps_since_log += 1
        if self.decode_steps_since_log % self.decode_log_interval:
            return
        now = time.perf_counter()
        gap = max(now - self.last_decode_log_time, 1e-9)
        self.last_gen_throughput = self.num_generated_tokens / gap
        self.num_generated_tokens = 0
        self.last_decode_log_time = now
        used, usage = memory.token_usage()
        msg = (f"Decode batch. #running-req: {len(queues.running)}, #token: {used}, token usage: {usage:.2f}, "
               f"{role.log_fields(decode=True)}")
        if self.speculative:
            steps, emitted, proposed, accepted = self.spec_window
            if steps:
                self.last_spec_accept_length = emitted / steps
                self.last_spec_accept_rate = accepted / proposed if proposed else 0.0
            self.spec_window = [0, 0, 0, 0]
            msg += f"accept len: {self.last_spec_accept_length:.2f}, accept rate: {self.last_spec_accept_rate:.2f}, "
        logger.info(msg + f"{self.graph}: False, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
                    f"#queue-req: {len(queues.waiting)}")


def embedding_info(pooling, model_config) -> dict:
    """Embedding servers: what `/v1/embeddings` and `/v1/rerank` check (vector size, pooling,
    matryoshka dimensions from config.json, as upstream)."""
    if pooling is None:
        return {}
    from sglang.srt.configs.model_config import num_labels_of

    hf = model_config.hf_config
    return {
        "is_classifier": pooling.classifier,
        "pooling_type": pooling.pooling_type,
        "embedding_normalize": pooling.normalize,
        "embedding_dim": num_labels_of(hf) if pooling.classifier else model_config.hidden_size,
        "is_matryoshka": bool(hf.get("is_matryoshka") or hf.get("matryoshka_dimensions")),
        "matryoshka_dimensions": hf.get("matryoshka_dimensions"),
    }
