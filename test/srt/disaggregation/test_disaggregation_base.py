"""base.py + transfer_backends.py: backend lookup (incl. upstream's unknown-backend message) and KVArgs built from real pools."""

import ctypes

import pytest
import torch

from sglang.srt.disaggregation.base import KVArgs, KVTransferError, kv_args_from_pools
from sglang.srt.disaggregation.transfer_backends import get_kv_class
from sglang.srt.disaggregation.fake import FakeKVManager, FakeKVReceiver, FakeKVSender
from sglang.srt.disaggregation.utils import KVClassType, MetadataBuffers, StateType, TransferBackend
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool


def test_get_kv_class_mapping():
    for backend in ("mooncake", TransferBackend.MOONCAKE, "mooncake_tcp", "fake"):
        assert get_kv_class(backend, KVClassType.KVARGS) is KVArgs
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVBootstrapServer, MooncakeKVManager, MooncakeKVReceiver, MooncakeKVSender

    for backend in ("mooncake", "mooncake_tcp"):
        assert get_kv_class(backend, KVClassType.MANAGER) is MooncakeKVManager
        assert get_kv_class(backend, KVClassType.SENDER) is MooncakeKVSender
        assert get_kv_class(backend, KVClassType.RECEIVER) is MooncakeKVReceiver
        assert get_kv_class(backend, KVClassType.BOOTSTRAP_SERVER) is MooncakeKVBootstrapServer
    assert get_kv_class(TransferBackend.FAKE, KVClassType.MANAGER) is FakeKVManager
    assert get_kv_class("fake", KVClassType.SENDER) is FakeKVSender
    assert get_kv_class("fake", KVClassType.RECEIVER) is FakeKVReceiver
    assert get_kv_class("fake", KVClassType.BOOTSTRAP_SERVER) is None  # fake has no bootstrap server


def test_get_kv_class_unknown_backend_message():
    with pytest.raises(ValueError) as e:
        get_kv_class("carrier_pigeon", KVClassType.MANAGER)
    assert str(e.value) == "Unsupported transfer backend: carrier_pigeon"


def test_kv_transfer_error_text():
    e = KVTransferError(42, "boom")
    assert str(e) == "KVTransferError(bootstrap_room=42): boom" and e.failure_reason == "boom"


@pytest.mark.parametrize("page_size", [1, 16])
def test_kv_args_from_pools_addresses_pages(page_size):
    pool = MHATokenToKVPool(64, page_size, torch.float16, 2, 8, layer_ids=[0, 2, 3], v_head_dim=4)
    for b in pool.k_buffer + pool.v_buffer:
        b.copy_(torch.randn_like(b, dtype=torch.float32).to(b.dtype))
    md = MetadataBuffers(4)
    args = kv_args_from_pools(pool, md, page_size)
    bufs = pool.k_buffer + pool.v_buffer
    assert args.kv_layer_ids == [0, 2, 3, 0, 2, 3]
    assert args.kv_data_lens == [b.nbytes for b in bufs]
    # K page = page_size*2*8*2 bytes, V page = page_size*2*4*2 bytes
    assert args.kv_item_lens == [page_size * 32] * 3 + [page_size * 16] * 3
    page = 2
    for b, ptr, il in zip(bufs, args.kv_data_ptrs, args.kv_item_lens):
        raw = ctypes.string_at(ptr + page * il, il)
        assert raw == b[page * page_size : (page + 1) * page_size].numpy().tobytes()
    assert (args.aux_data_ptrs, args.aux_data_lens, args.aux_item_lens) == md.get_buf_infos()
    assert args.page_size == page_size and args.state_types == []


def test_kv_args_from_pools_with_state_tensors():
    pool = MHATokenToKVPool(16, 1, torch.float32, 1, 4, layer_ids=[0])
    conv, ssm = torch.zeros(5, 3, 2), torch.zeros(5, 4, 4, dtype=torch.bfloat16)
    args = kv_args_from_pools(pool, None, 1, mamba_pool=[conv, ssm])
    assert args.state_types == [StateType.MAMBA]
    assert args.state_data_ptrs == [[conv.data_ptr(), ssm.data_ptr()]]
    assert args.state_item_lens == [[3 * 2 * 4, 4 * 4 * 2]]
    assert args.aux_data_ptrs == []
    with pytest.raises(ValueError):
        kv_args_from_pools(pool, None, 1, mamba_pool=[torch.zeros(4, 6)[:, ::2]])
