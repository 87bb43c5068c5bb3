"""A data-parallel replica's load, in shared memory: written by the replica's scheduler loop once
per turn, read by the data-parallel controller in the tokenizer process when it dispatches.

Why shared memory and not a message: the controller needs the load at every dispatch, and a
replica busy with a forward cannot answer; a few int64 slots cost nothing to write each turn and
can be read at any time (as the heartbeat, `utils/heartbeat.py`).

What a replica reports: how many requests it has taken in so far (`received`, with their prompt
tokens) and how many it holds now (`queued`: waiting, running, in the grammar queue; with their
tokens). The controller knows how many it sent, so the requests still in the socket are
`sent - received`, and a replica's load is `queued + in transit`, exact even right after a burst
of dispatches that the replica has not read yet. The replica writes `queued` before `received`
(and the controller reads them in the other order), so a torn read can only over-count a
request for one turn, never lose one.
"""

from __future__ import annotations

from typing import Tuple

_QUEUED_REQS, _QUEUED_TOKENS, _RECEIVED_REQS, _RECEIVED_TOKENS = range(4)


class ReplicaLoad:
    def __init__(self, mp_context=None):
        """`mp_context`: the multiprocessing context the replica is spawned with (shared memory);
        None: plain values, for a loop that runs in this process."""
        self._slots = mp_context.RawArray("q", 4) if mp_context is not None else [0, 0, 0, 0]

    def publish(self, queued_reqs: int, queued_tokens: int, received_reqs: int, received_tokens: int) -> None:
        s = self._slots
        s[_QUEUED_REQS] = queued_reqs
        s[_QUEUED_TOKENS] = queued_tokens
        s[_RECEIVED_TOKENS] = received_tokens
        s[_RECEIVED_REQS] = received_reqs

    def received(self) -> Tuple[int, int]:
        """(requests, prompt tokens) the replica has taken in so far."""
        s = self._slots
        return s[_RECEIVED_REQS], s[_RECEIVED_TOKENS]

    def queued(self) -> Tuple[int, int]:
        """(requests, tokens) the replica holds now."""
        s = self._slots
        return s[_QUEUED_REQS], s[_QUEUED_TOKENS]
