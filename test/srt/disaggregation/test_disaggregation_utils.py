"""utils.py: wire packing round trips, contiguous grouping vs a brute-force reference, page indices,
metadata rows (layout and round trip), metadata row allocator.

(Named test_disaggregation_utils.py rather than test_utils.py: pytest's default import mode
needs unique test basenames across the tree.)
"""

import struct

import numpy as np
import pytest
import torch

from sglang.srt.disaggregation.utils import (
    KVPoll,
    MetadataBuffers,
    ReqToMetadataIdxAllocator,
    StateType,
    group_concurrent_contiguous,
    kv_to_page_indices,
    kv_to_page_num,
    pack_int_lists,
    pack_ints,
    pack_list_of_buffers,
    unpack_int_lists,
    unpack_ints,
    unpack_list_of_buffers,
)


def test_kvpoll_and_state_type_values_match_upstream():
    assert (KVPoll.Failed, KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success) == (0, 1, 2, 3, 4)
    assert StateType.MAMBA == "mamba" and StateType.SWA == "swa" and StateType.DSV4_REQUEST_STATE == "c128_state"


def test_pack_list_of_buffers_layout_and_round_trip():
    assert pack_list_of_buffers([]) == b""
    bufs = [b"ab", b"", b"xyz"]
    packed = pack_list_of_buffers(bufs)
    # header: n, then each length, little-endian uint32
    assert packed[:16] == struct.pack("<4I", 3, 2, 0, 3)
    assert packed[16:] == b"abxyz"
    assert unpack_list_of_buffers(packed) == bufs
    assert unpack_list_of_buffers(b"") == []
    with pytest.raises(ValueError):
        unpack_list_of_buffers(packed + b"!")


@pytest.mark.parametrize("fmt", ["Q", "I", "i"])
def test_pack_int_lists_round_trip(fmt):
    rng = np.random.default_rng(0)
    hi = {"Q": 2**63, "I": 2**32, "i": 2**31}[fmt]
    lo = -(2**31) if fmt == "i" else 0
    lists = [rng.integers(lo, hi, size=n, dtype=np.int64).tolist() for n in (0, 1, 5, 17)]
    packed = pack_int_lists(lists, fmt)
    assert unpack_int_lists(packed, fmt) == lists
    # same bytes as the upstream formula
    assert packed == pack_list_of_buffers([struct.pack(f"<{len(a)}{fmt}", *a) for a in lists])
    assert unpack_ints(pack_ints(lists[3], fmt), fmt) == lists[3]


def _reference_groups(src, dst):
    groups_s, groups_d = [], []
    for s, d in zip(src.tolist(), dst.tolist()):
        if groups_s and s == groups_s[-1][-1] + 1 and d == groups_d[-1][-1] + 1:
            groups_s[-1].append(s)
            groups_d[-1].append(d)
        else:
            groups_s.append([s])
            groups_d.append([d])
    return groups_s, groups_d


@pytest.mark.parametrize(
    "src,dst,expected_src",
    [
        ([], [], []),
        ([5], [9], [[5]]),
        ([1, 2, 3, 4], [10, 11, 12, 13], [[1, 2, 3, 4]]),
        ([1, 2, 3, 4], [10, 11, 20, 21], [[1, 2], [3, 4]]),  # break on the decode side only
        ([1, 2, 7, 8], [10, 11, 12, 13], [[1, 2], [7, 8]]),  # break on the prefill side only
        ([3, 2, 1], [1, 2, 3], [[3], [2], [1]]),  # descending is never contiguous
        ([1, 1, 2], [4, 5, 6], [[1], [1, 2]]),
    ],
)
def test_group_concurrent_contiguous_vectors(src, dst, expected_src):
    s, d = group_concurrent_contiguous(np.array(src, dtype=np.int32), np.array(dst, dtype=np.int32))
    assert s == expected_src
    assert [len(g) for g in d] == [len(g) for g in s]
    assert sum(d, []) == dst


def test_group_concurrent_contiguous_random_vs_reference():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(1, 60))
        src = np.cumsum(rng.integers(1, 3, size=n)).astype(np.int32)
        dst = np.cumsum(rng.integers(1, 3, size=n)).astype(np.int32)
        assert group_concurrent_contiguous(src, dst) == _reference_groups(src, dst)
    with pytest.raises(ValueError):
        group_concurrent_contiguous(np.arange(3), np.arange(4))


def test_kv_to_page_indices():
    # page_size 4: a request holding pages 3, 7, 5 (token slots in order)
    slots = torch.tensor([12, 13, 14, 15, 28, 29, 30, 31, 20, 21])
    out = kv_to_page_indices(slots, 4)
    assert out.dtype == np.int32 and out.tolist() == [3, 7, 5]
    assert kv_to_page_indices(np.array([9, 4, 6]), 1).tolist() == [9, 4, 6]
    assert kv_to_page_num(10, 4) == 3 and kv_to_page_num(8, 4) == 2 and kv_to_page_num(0, 4) == 0


def test_metadata_buffers_rows_are_padded_and_round_trip():
    mb = MetadataBuffers(6, max_top_logprobs_num=16, hidden_size=8)
    ptrs, lens, item_lens = mb.get_buf_infos()
    assert len(ptrs) == len(lens) == len(item_lens) == 8
    assert all(il >= 64 for il in item_lens)
    assert all(ln == il * 6 for ln, il in zip(lens, item_lens))
    hidden = torch.randn(8)
    mb.set_buf(
        3,
        output_id=1234,
        cached_tokens=17,
        output_token_logprob_val=-0.25,
        top_logprobs_val=[-0.25, -1.5, -3.0],
        top_logprobs_idx=[1234, 7, 99],
        bootstrap_room=2**62 + 5,
        hidden_state=hidden,
    )
    row = mb.get_buf(3)
    assert row.output_id == 1234 and row.cached_tokens == 17
    assert row.output_token_logprob_val == -0.25 and row.output_token_logprob_idx == 1234
    assert row.top_logprobs_val == [-0.25, -1.5, -3.0] and row.top_logprobs_idx == [1234, 7, 99]
    assert row.bootstrap_room == 2**62 + 5
    assert torch.equal(row.hidden_state, hidden)
    # other rows untouched; a row without logprobs reports None
    assert mb.get_buf(2).output_id == 0
    mb.set_buf(3, output_id=5)
    assert mb.get_buf(3).output_token_logprob_val is None and mb.get_buf(3).top_logprobs_val == []
    with pytest.raises(ValueError):
        mb.set_buf(0, 1, top_logprobs_val=[0.0] * 17, top_logprobs_idx=[0] * 17)


def test_metadata_row_bytes_copy_to_another_buffer():
    """A byte copy of row i of every buffer (what the transfer does) reproduces the row."""
    a, b = MetadataBuffers(4), MetadataBuffers(4)
    a.set_buf(1, 77, cached_tokens=3, output_token_logprob_val=-1.0, top_logprobs_val=[-1.0], top_logprobs_idx=[77], bootstrap_room=9)
    for src, dst in zip(a._buffers(), b._buffers()):
        dst[2].view(torch.uint8).copy_(src[1].view(torch.uint8))
    assert b.get_buf(2) == a.get_buf(1)


def test_req_to_metadata_idx_allocator():
    alloc = ReqToMetadataIdxAllocator(3)
    got = [alloc.alloc() for _ in range(3)]
    assert sorted(got) == [0, 1, 2] and alloc.alloc() is None and alloc.available_size() == 0
    alloc.free(got[1])
    assert alloc.available_size() == 1 and alloc.alloc() == got[1]
