"""(Tokenizer/HTTP process.) The one door from the tokenizer to the scheduler replicas: with
`--dp-size N` there are N schedulers, each with its own model copy, pools and radix cache, and
this controller picks one for each tokenized request (`--load-balance-method`); with N = 1 it is
a plain socket to the one scheduler.

Upstream runs its `DataParallelController` as a process between the tokenizer and the schedulers;
here it lives in the tokenizer process: one hop and one process less on shared CPU cores, and it
knows which replica holds each request for as long as the tokenizer tracks it (`forget`), so an
abort goes to that replica only. Outputs still flow replica -> detokenizer -> tokenizer, every
replica pushing to the one detokenizer.

Dispatch (upstream's `LoadBalanceMethod` names):
  round_robin            replicas in turn (the default, `auto`, on a plain server)
  total_requests         the replica with the fewest requests (waiting + running, as each replica
                         reports in shared memory, `replica_load.py`, plus those still in its socket):
                         the shortest queue
  total_tokens           the replica with the fewest tokens in those requests (ties: fewest requests)
  follow_bootstrap_room  `bootstrap_room % N` (upstream's PD prefill rule: the decode side looks for a
                         room's KV on that prefill replica); requests without a room go round-robin
A request's `routed_dp_rank` (or the deprecated `data_parallel_rank`) sends it to that replica
whatever the method, as upstream's external DP routing.

Control messages (flush the cache, read the internal state) go to every replica; each reply
carries its replica's `dp_rank`, and the tokenizer waits for one reply from each.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Dict, List, Optional, Sequence

from sglang.srt.managers.internal_channel import send_msg
from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput


class LoadBalanceMethod(enum.Enum):
    ROUND_ROBIN = "round_robin"
    FOLLOW_BOOTSTRAP_ROOM = "follow_bootstrap_room"
    TOTAL_REQUESTS = "total_requests"
    TOTAL_TOKENS = "total_tokens"

    @classmethod
    def from_str(cls, method: str) -> "LoadBalanceMethod":
        try:
            return cls(method.lower())
        except ValueError as exc:
            raise ValueError(f"Invalid load balance method: {method}") from exc


def replica_input_names(scheduler_input_ipc_name: str, dp_size: int) -> List[str]:
    """Each replica's input socket; one replica keeps the server's own name."""
    if dp_size <= 1:
        return [scheduler_input_ipc_name]
    return [f"{scheduler_input_ipc_name}_dp{i}" for i in range(dp_size)]


def check_routed_rank(rank: Optional[int], dp_size: int) -> None:
    """A request's `routed_dp_rank` must name a replica (HTTP 400 otherwise)."""
    if rank is None:
        return
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < dp_size:
        raise ValueError(f"routed_dp_rank must be an integer in [0, {dp_size}) (--dp-size {dp_size}), got {rank!r}.")


@dataclasses.dataclass
class _Sent:
    reqs: int = 0
    tokens: int = 0


class DataParallelController:
    def __init__(self, sockets: Sequence, method: str = "round_robin", loads: Optional[Sequence] = None,
                 rooms_fix_replica: bool = False):
        """`sockets`: one connected PUSH socket per replica, in dp_rank order. `loads`: each
        replica's `ReplicaLoad` (None: nothing reported, total_requests/total_tokens fall back
        to counting what this controller sent). `rooms_fix_replica`: a PD prefill server, whose
        decode peers look for a room's KV on replica `bootstrap_room % N`."""
        self.sockets = list(sockets)
        self.rooms_fix_replica = rooms_fix_replica
        self.method = LoadBalanceMethod.from_str("round_robin" if method in (None, "auto") else method)
        self.loads = list(loads) if loads is not None else None
        self.round_robin_counter = 0
        self.sent = [_Sent() for _ in self.sockets]
        self.holder: Dict[str, int] = {}  # rid -> dp_rank, while the tokenizer tracks the request

    @property
    def size(self) -> int:
        return len(self.sockets)

    # --- requests --------------------------------------------------------------------------------
    def send_requests(self, reqs: List[TokenizedGenerateReqInput], routed: Sequence[Optional[int]] = ()) -> List[int]:
        """Sends each request to one replica (a batch to one replica goes as one message);
        returns each request's dp_rank. `routed`: the requests' `routed_dp_rank`, if any."""
        if self.size == 1:
            send_msg(self.sockets[0], reqs if len(reqs) > 1 else reqs[0])
            return [0] * len(reqs)
        ranks = [self._pick(r, routed[i] if i < len(routed) else None) for i, r in enumerate(reqs)]
        by_rank: Dict[int, List[TokenizedGenerateReqInput]] = {}
        for r, rank in zip(reqs, ranks):
            by_rank.setdefault(rank, []).append(r)
        for rank, batch in by_rank.items():
            send_msg(self.sockets[rank], batch if len(batch) > 1 else batch[0])
            for r in batch:
                self.holder[r.rid] = rank
                self.sent[rank].reqs += 1
                self.sent[rank].tokens += len(r.input_ids)
        return ranks

    def _pick(self, req: TokenizedGenerateReqInput, routed: Optional[int]) -> int:
        if routed is not None:
            check_routed_rank(routed, self.size)
            if self.rooms_fix_replica and isinstance(req.bootstrap_room, int) and routed != req.bootstrap_room % self.size:
                raise ValueError(f"routed_dp_rank {routed} does not hold bootstrap_room {req.bootstrap_room} on this "
                                 f"PD prefill server: its decode peers look for the KV on replica "
                                 f"bootstrap_room % {self.size} = {req.bootstrap_room % self.size}.")
            rank = routed
        elif self.method is LoadBalanceMethod.FOLLOW_BOOTSTRAP_ROOM and isinstance(req.bootstrap_room, int):
            rank = req.bootstrap_room % self.size
        elif self.method is LoadBalanceMethod.TOTAL_REQUESTS:
            rank = min(range(self.size), key=lambda i: (self.load_of(i)[0], i))
        elif self.method is LoadBalanceMethod.TOTAL_TOKENS:
            rank = min(range(self.size), key=lambda i: (self.load_of(i)[1], self.load_of(i)[0], i))
        else:
            rank = self.round_robin_counter
            self.round_robin_counter = (self.round_robin_counter + 1) % self.size
        return rank

    def load_of(self, rank: int):
        """(requests, tokens) replica `rank` holds or has yet to read from its socket."""
        sent = self.sent[rank]
        if self.loads is None:
            return sent.reqs, sent.tokens
        load = self.loads[rank]
        received_reqs, received_tokens = load.received()  # read before `queued` (see replica_load.py)
        queued_reqs, queued_tokens = load.queued()
        return (queued_reqs + max(sent.reqs - received_reqs, 0),
                queued_tokens + max(sent.tokens - received_tokens, 0))

    def rank_of(self, rid: str) -> Optional[int]:
        return self.holder.get(rid, 0 if self.size == 1 else None)

    def forget(self, rid: str) -> None:
        self.holder.pop(rid, None)

    # --- aborts and control ----------------------------------------------------------------------
    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        """To the replica that holds `rid`; to all of them for `abort_all` or a rid not (or no
        longer) known here (an unknown rid is a no-op in a scheduler)."""
        rank = None if abort_all else self.rank_of(rid)
        msg = AbortReq(rid=rid, abort_all=abort_all)
        if rank is not None:
            send_msg(self.sockets[rank], msg)
        else:
            self.broadcast(msg)

    def broadcast(self, msg) -> None:
        for sock in self.sockets:
            send_msg(sock, msg)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
