"""(Detokenizer process.) Turns token ids into text incrementally, never splitting a UTF-8 character.

Per request we keep (decoded_text, surr_offset, read_offset): `decode(ids[surr:read])` is the
text already committed for the surrounding window, `decode(ids[surr:])` the text with the new
tokens; their difference is the new text. It is committed only when it does not end in the
replacement character (an incomplete multi-byte sequence). On finish the matched stop string
(or stop token) is trimmed unless `no_stop_trim`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from sglang.srt.managers.io_struct import BatchStrOutput, BatchTokenIDOutput

logger = logging.getLogger(__name__)

MAX_STATES = 1 << 16  # upstream: SGLANG_DETOKENIZER_MAX_STATES


@dataclass
class DecodeStatus:
    decoded_text: str = ""
    surr_offset: int = 0
    read_offset: int = 0


def trim_matched_stop(text: str, finished_reason: Optional[dict], no_stop_trim: bool) -> str:
    if no_stop_trim or not finished_reason or finished_reason.get("type") != "stop":
        return text
    matched = finished_reason.get("matched")
    if isinstance(matched, str) and matched:
        pos = text.find(matched)
        return text[:pos] if pos != -1 else text
    return text


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: "OrderedDict[str, DecodeStatus]" = OrderedDict()

    def _decode(self, ids, skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def handle(self, out: BatchTokenIDOutput) -> BatchStrOutput:
        """Decodes every request of `out`; one that fails to decode ends with an abort (500) that
        the tokenizer manager forwards to the scheduler, the others are unaffected."""
        texts = []
        reasons = list(out.finished_reasons)
        for i, rid in enumerate(out.rids):
            try:
                texts.append(self._decode_one(out, i, rid))
            except Exception as e:  # noqa: BLE001
                logger.exception("Detokenizing request %s failed", rid)
                self.states.pop(rid, None)
                texts.append("")
                reasons[i] = {"type": "abort", "message": f"Internal server error while detokenizing: {e}",
                              "status_code": 500, "err_type": "InternalServerError"}
        return BatchStrOutput(
            rids=out.rids,
            finished_reasons=reasons,
            output_strs=texts,
            output_ids=out.output_ids,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            retraction_counts=out.retraction_counts,
            output_token_logprobs=out.output_token_logprobs,
            output_top_logprobs=out.output_top_logprobs,
            input_token_logprobs=out.input_token_logprobs,
            input_top_logprobs=out.input_top_logprobs,
            output_token_ids_logprobs=out.output_token_ids_logprobs,
            input_token_ids_logprobs=out.input_token_ids_logprobs,
            embeddings=out.embeddings,
            spec_verify_ct=out.spec_verify_ct,
            spec_num_proposed_drafts=out.spec_num_proposed_drafts,
            spec_num_correct_drafts=out.spec_num_correct_drafts,
        )

    def _decode_one(self, out: BatchTokenIDOutput, i: int, rid: str) -> str:
        ids = out.output_ids[i]
        reason = out.finished_reasons[i]
        if reason and reason.get("type") == "stop" and isinstance(reason.get("matched"), int) and not out.no_stop_trim[i]:
            ids = ids[:-1]  # a matched stop token is not part of the text
        st = self.states.get(rid)
        if st is None:
            st = DecodeStatus()
            self.states[rid] = st
            if len(self.states) > MAX_STATES:
                self.states.popitem(last=False)
        skip = out.skip_special_tokens[i]
        surr_text = self._decode(ids[st.surr_offset : st.read_offset], skip)
        read_text = self._decode(ids[st.surr_offset :], skip)
        new_text = read_text[len(surr_text) :]
        if reason is not None:
            self.states.pop(rid, None)
            return trim_matched_stop(st.decoded_text + new_text, reason, out.no_stop_trim[i])
        if new_text and not new_text.endswith("\ufffd"):
            st.decoded_text += new_text
            st.surr_offset = st.read_offset
            st.read_offset = len(ids)
        return st.decoded_text


def _handle_contained(detok: IncrementalDetokenizer, msg: BatchTokenIDOutput) -> Optional[BatchStrOutput]:
    """`detok.handle(msg)`; a message it cannot even take apart (its lists do not line up) is
    logged and dropped instead of ending the process. (Errors of one request are handled inside.)"""
    try:
        return detok.handle(msg)
    except Exception:  # noqa: BLE001
        logger.exception("The detokenizer dropped a malformed BatchTokenIDOutput")
        return None


def run_detokenizer_process(server_args, port_args, ready_pipe=None, notify_parent: bool = False,
                            tokenizer=None) -> None:
    """Subprocess entry: PULL BatchTokenIDOutput from the scheduler, PUSH BatchStrOutput to the tokenizer manager.

    `tokenizer`: the server's tokenizer, already loaded by the parent (it arrives pickled:
    unpickling it costs ~1.7 s and no torch import, loading it again ~6 s, most of it importing
    torch and the model's HF config); loaded here when not given. This process never needs torch."""
    import zmq

    from sglang.srt.utils.process import configure_subprocess

    configure_subprocess("detokenizer", server_args, torch_threads=0)
    if tokenizer is None:
        from sglang.srt.managers.tokenizer_loading import load_tokenizer

        tokenizer = load_tokenizer(server_args)
    from sglang.srt.managers.internal_channel import bind_private, recv_msg, send_msg

    detok = IncrementalDetokenizer(tokenizer)
    ctx = zmq.Context(2)
    recv = ctx.socket(zmq.PULL)
    bind_private(recv, port_args.detokenizer_ipc_name)
    send = ctx.socket(zmq.PUSH)
    send.connect(port_args.tokenizer_ipc_name)
    if ready_pipe is not None:
        ready_pipe.send("ready")
    try:
        while True:
            msg = recv_msg(recv, "detokenizer input")
            if msg is None:  # not one of our messages: dropped (and logged)
                continue
            if isinstance(msg, BatchTokenIDOutput):
                if msg.rids:
                    out = _handle_contained(detok, msg)
                    if out is not None:
                        send_msg(send, out)
            else:
                send_msg(send, msg)  # control replies pass through
    except SystemExit:  # SIGTERM from the parent: a normal shutdown
        from sglang.srt.utils.process import exit_after_cleanup

        ctx.destroy(linger=0)
        exit_after_cleanup(0)
    except BaseException:  # noqa: BLE001 - fatal: as upstream, say so and take the server down
        import traceback

        from sglang.srt.utils.process import notify_parent_and_exit

        logger.error("DetokenizerManager hit an exception: %s", traceback.format_exc())
        notify_parent_and_exit(1, notify_parent)
