"""Mooncake KV manager/sender/receiver in one process over real loopback TCP (Mooncake engine, ZMQ,
bootstrap HTTP server): several concurrent requests, page sizes 1 and 16, non-contiguous pages,
metadata rows, chunked sends, Mamba-style state slots, layout mismatch errors."""

import dataclasses

import numpy as np
import pytest
import torch

from pd_pair import PDPair, random_pages, wait_poll
from sglang.srt.configs.runtime_config import DisaggConfig
from sglang.srt.disaggregation.utils import KVPoll, kv_to_page_indices

DONE = {KVPoll.Success, KVPoll.Failed}


@pytest.fixture(scope="module", params=[1, 16])
def pair(request):
    p = PDPair(page_size=request.param, num_pages=64)
    yield p
    p.close()


def test_several_requests_pages_and_metadata(pair):
    rng = np.random.default_rng(pair.prefill.page_size)
    ps = pair.prefill.page_size
    token_counts = [1, 3 * ps + 1, 9 * ps]  # partial last pages included
    used_src, used_dst, reqs = [], [], []
    for i, ntok in enumerate(token_counts):
        n_pages = -(-ntok // ps)
        src = random_pages(rng, 64, n_pages, exclude=used_src)
        dst = random_pages(rng, 64, n_pages, exclude=used_dst)
        used_src += src.tolist()
        used_dst += dst.tolist()
        room = 1000 + 10 * ps + i
        snd, rcv = pair.bootstrapped_pair(room, dst, aux_index=i + 1)
        reqs.append((room, snd, rcv, src, dst))
    for i, (room, snd, rcv, src, dst) in enumerate(reqs):
        pair.prefill.metadata.set_buf(
            i, output_id=500 + i, cached_tokens=i, output_token_logprob_val=-0.5 * i,
            top_logprobs_val=[-0.5 * i, -2.0], top_logprobs_idx=[500 + i, 3], bootstrap_room=room,
        )
        snd.init(len(src), aux_index=i)
        snd.send(src)
    for i, (room, snd, rcv, src, dst) in enumerate(reqs):
        assert wait_poll(rcv, DONE, 10) == KVPoll.Success
        assert wait_poll(snd, DONE, 10) == KVPoll.Success
        pair.assert_pages_equal(src, dst)
        assert pair.decode.metadata.get_buf(i + 1) == pair.prefill.metadata.get_buf(i)
        assert pair.decode.metadata.get_buf(i + 1).bootstrap_room == room
        metric = snd.get_transfer_metric()
        bytes_per_page = sum(pair.prefill.kv_args.kv_item_lens)
        assert metric.transfer_total_bytes == len(src) * bytes_per_page + sum(pair.prefill.kv_args.aux_item_lens)
        snd.clear()
        rcv.clear()
    # pages no request targeted are untouched on decode
    untouched = [p for p in range(1, 65) if p not in used_dst][:5]
    for b in range(pair.decode.num_buffers):
        for p in untouched:
            assert not pair.decode.page(b, p).any()


def test_chunked_send(pair):
    """Two send() calls; the first ends on a page boundary; Success only after the last one."""
    ps = pair.prefill.page_size
    rng = np.random.default_rng(100 + ps)
    # prefill pages from a real token->slot map, as the scheduler computes them
    src = random_pages(rng, 64, 6)
    slots = torch.cat([torch.arange(p * ps, p * ps + ps) for p in src.tolist()])[: 5 * ps + 1]
    assert kv_to_page_indices(slots, ps).tolist() == src.tolist()
    dst = random_pages(rng, 64, 6)
    room = 2000 + ps
    snd, rcv = pair.bootstrapped_pair(room, dst, aux_index=5)
    pair.prefill.metadata.set_buf(4, output_id=77, bootstrap_room=room)
    snd.init(len(src), aux_index=4)
    snd.send(src[:4])
    # the first chunk alone never concludes the request
    assert wait_poll(rcv, DONE, 0.5) == KVPoll.Transferring
    assert snd.poll() == KVPoll.Transferring
    snd.send(src[4:])
    assert wait_poll(rcv, DONE, 10) == KVPoll.Success
    assert wait_poll(snd, DONE, 10) == KVPoll.Success
    pair.assert_pages_equal(src, dst)
    assert pair.decode.metadata.get_buf(5).output_id == 77


def test_metadata_before_sender_exists(pair):
    """Decode may be faster than prefill: metadata arriving before the sender is built is kept."""
    ps = pair.prefill.page_size
    src, dst = np.array([7, 8], np.int32), np.array([30, 2], np.int32)
    room = 3000 + ps
    rcv = pair.receiver(room)
    rcv.init(0)
    assert wait_poll(rcv, {KVPoll.WaitingForInput, KVPoll.Failed}, 10) == KVPoll.WaitingForInput
    rcv.send_metadata(dst, 6)
    snd = pair.sender(room)
    assert wait_poll(snd, {KVPoll.WaitingForInput, KVPoll.Failed}, 10) == KVPoll.WaitingForInput
    snd.init(2, aux_index=6)
    snd.send(src)
    assert wait_poll(rcv, DONE, 10) == KVPoll.Success
    pair.assert_pages_equal(src, dst)


def test_metadata_before_bootstrap_resolved(pair):
    """send_metadata right after init() (before the route is resolved) is delivered once resolved."""
    ps = pair.prefill.page_size
    src, dst = np.array([11], np.int32), np.array([12], np.int32)
    room = 3500 + ps
    snd = pair.sender(room)
    rcv = pair.receiver(room)
    rcv.init(0)
    rcv.send_metadata(dst, 7)
    assert wait_poll(snd, {KVPoll.WaitingForInput, KVPoll.Failed}, 10) == KVPoll.WaitingForInput
    snd.init(1, aux_index=7)
    snd.send(src)
    assert wait_poll(rcv, DONE, 10) == KVPoll.Success
    pair.assert_pages_equal(src, dst)


def test_mamba_state_slot_transfer():
    p = PDPair(page_size=4, num_pages=16, with_state=True)
    try:
        src, dst = np.array([3, 4], np.int32), np.array([9, 1], np.int32)
        snd, rcv = p.bootstrapped_pair(42, dst, aux_index=0, state_indices=[[5]])
        p.prefill.metadata.set_buf(1, output_id=9, bootstrap_room=42)
        snd.init(2, aux_index=1)
        snd.send(src, state_indices=[2])  # a flat list is accepted for a single state type
        assert wait_poll(rcv, DONE, 10) == KVPoll.Success
        for t_src, t_dst in zip(p.prefill.state, p.decode.state):
            assert torch.equal(t_dst[5], t_src[2])
            assert not t_dst[[0, 1, 2, 3, 4]].any()  # only the target slot was written
        p.assert_pages_equal(src, dst)
        assert p.decode.metadata.get_buf(0).output_id == 9
    finally:
        p.close()


@pytest.mark.parametrize("kw,decode_layout", [
    (dict(decode_head_dim=4), "mha:layers=3,heads=2,k=4,v=4,dtype=bfloat16"),
    # an MLA decode whose pages have the MHA prefill's size: only the layout tells them apart
    (dict(decode_mla=True), "mla:layers=3,kv_lora_rank=12,rope=4,dtype=bfloat16"),
])
def test_kv_layout_mismatch_fails_at_bootstrap(kw, decode_layout):
    """Pages of one layout copied into the other would be garbage: the decode side refuses the
    prefill at bootstrap, naming both layouts, before it registers or sends anything."""
    p = PDPair(page_size=1, num_pages=8, **kw)
    try:
        rcv = p.receiver(77)
        rcv.init(0)
        assert wait_poll(rcv, DONE, 10) == KVPoll.Failed
        with pytest.raises(Exception, match=f"Prefill KV layout mha:layers=3,heads=2,k=8,v=8,dtype=bfloat16 does not "
                                            f"match decode KV layout {decode_layout}"):
            rcv.failure_exception()
    finally:
        p.close()


def test_mla_pages_transfer():
    p = PDPair(page_size=4, num_pages=16, prefill_mla=True, decode_mla=True)
    try:
        src, dst = np.array([3, 4, 9], np.int32), np.array([7, 2, 3], np.int32)
        snd, rcv = p.bootstrapped_pair(78, dst, aux_index=0)
        snd.init(3, aux_index=0)
        snd.send(src)
        assert wait_poll(rcv, DONE, 10) == KVPoll.Success
        assert p.decode.num_buffers == 3  # one latent buffer per layer, no V buffers
        p.assert_pages_equal(src, dst)
    finally:
        p.close()


def test_page_size_mismatch_fails_at_bootstrap():
    p = PDPair(page_size=4, num_pages=8, decode_page_size=8)
    try:
        rcv = p.receiver(5)
        rcv.init(0)
        assert wait_poll(rcv, DONE, 10) == KVPoll.Failed
        with pytest.raises(Exception, match="Prefill page_size 4 does not match decode page_size 8"):
            rcv.failure_exception()
    finally:
        p.close()


@pytest.mark.parametrize("limit", [None, "16"])
def test_many_blocks_split_across_engine_batches(monkeypatch, limit):
    """Fully fragmented pages give more blocks than one Mooncake batch accepts (~2k); all still arrive."""
    if limit:
        monkeypatch.setenv("SGLANG_DISAGGREGATION_MAX_TRANSFER_BLOCKS", limit)
    p = PDPair(page_size=1, num_pages=1024)
    try:
        assert p.prefill.manager.max_transfer_blocks == int(limit or 2048)
        src = np.arange(2, 1002, 2, dtype=np.int32)  # 500 pages, no two adjacent: 500 x 6 buffers = 3000 blocks
        dst = np.arange(1001, 1, -2, dtype=np.int32)
        snd, rcv = p.bootstrapped_pair(99, dst, aux_index=0)
        snd.init(len(src), aux_index=0)
        snd.send(src)
        assert wait_poll(rcv, DONE, 30) == KVPoll.Success
        p.assert_pages_equal(src, dst)
    finally:
        p.close()


def test_concurrent_requests_with_random_chunking():
    """24 requests in flight at once over the 4 transfer workers, each sent in 1-3 chunks in an
    interleaved order: every page lands where its own request asked, every metadata row arrives."""
    p = PDPair(page_size=2, num_pages=512)
    rng = np.random.default_rng(5)
    try:
        pages_src = rng.permutation(np.arange(1, 513, dtype=np.int32))
        pages_dst = rng.permutation(np.arange(1, 513, dtype=np.int32))
        reqs = []
        off = 0
        for i in range(24):
            n = int(rng.integers(1, 20))
            src, dst = pages_src[off : off + n], pages_dst[off : off + n]
            off += n
            room = 7000 + i
            meta_src, meta_dst = i % 8, (i * 3) % 8
            snd, rcv = p.bootstrapped_pair(room, dst, aux_index=meta_dst)
            cuts = sorted(set(rng.integers(1, n, size=2).tolist())) if n > 2 else []
            chunks = [c for c in np.split(src, cuts) if len(c)]
            reqs.append([room, snd, rcv, src, dst, chunks, meta_src, meta_dst])
        # interleave: round-robin over requests, one chunk each
        while any(r[5] for r in reqs):
            for r in reqs:
                room, snd, rcv, src, dst, chunks, meta_src, meta_dst = r
                if not chunks:
                    continue
                if snd.num_kv_indices is None:
                    snd.init(len(src), aux_index=meta_src)
                if len(chunks) == 1:  # the last chunk carries this request's metadata row
                    p.prefill.metadata.set_buf(meta_src, output_id=room, bootstrap_room=room)
                    snd.send(chunks.pop(0))
                    assert wait_poll(rcv, DONE, 10) == KVPoll.Success  # row slot is reused by a later request
                    assert p.decode.metadata.get_buf(meta_dst).bootstrap_room == room
                else:
                    snd.send(chunks.pop(0))
        for room, snd, rcv, src, dst, *_ in reqs:
            assert wait_poll(snd, DONE, 10) == KVPoll.Success
            p.assert_pages_equal(src, dst)
    finally:
        p.close()


def test_two_prefill_dp_ranks_route_by_bootstrap_room():
    """Two prefill DP ranks behind one bootstrap server: with prefill_dp_rank=None the decode picks
    `room % dp_size` (follow_bootstrap_room), and each rank serves only its own rooms."""
    from pd_pair import Side
    from sglang.srt.disaggregation.bootstrap_server import KVBootstrapServer
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.utils import get_free_port

    port = get_free_port()
    server = KVBootstrapServer("127.0.0.1", port)
    sa = DisaggConfig(host="127.0.0.1", disaggregation_bootstrap_port=port, disaggregation_transfer_backend="mooncake_tcp", tp_size=1, dp_size=2)
    prefills = [Side(DisaggregationMode.PREFILL, sa, 1, 16, seed=10 + r, system_dp_rank=r) for r in range(2)]
    decode = Side(DisaggregationMode.DECODE, dataclasses.replace(sa, dp_size=1), 1, 16)
    from sglang.srt.disaggregation.transfer_backends import get_kv_class
    from sglang.srt.disaggregation.utils import KVClassType

    S, R = get_kv_class("mooncake_tcp", KVClassType.SENDER), get_kv_class("mooncake_tcp", KVClassType.RECEIVER)
    addr = f"127.0.0.1:{port}"
    try:
        for room, src, dst in ((8, [3], [5]), (13, [4], [6])):
            owner = prefills[room % 2]
            snd = S(owner.manager, addr, room)
            rcv = R(decode.manager, addr, room)
            rcv.init(None)
            assert wait_poll(rcv, {KVPoll.WaitingForInput, KVPoll.Failed}, 10) == KVPoll.WaitingForInput
            rcv.send_metadata(np.array(dst, np.int32), 0)
            assert wait_poll(snd, {KVPoll.WaitingForInput, KVPoll.Failed}, 10) == KVPoll.WaitingForInput
            other = prefills[1 - room % 2].manager
            assert room not in other.transfer_infos and other.check_status(room) is None
            snd.init(1, aux_index=0)
            snd.send(np.array(src, np.int32))
            assert wait_poll(rcv, DONE, 10) == KVPoll.Success
            for b in range(decode.num_buffers):
                assert torch.equal(decode.page(b, dst[0]), owner.page(b, src[0]))
    finally:
        for side in prefills + [decode]:
            side.manager.close()
        server.close()
