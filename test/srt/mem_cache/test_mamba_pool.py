"""MambaPool: slot allocation (slot 0 is padding), zeroing, copy-on-write copies, CPU backup and
restore, the per-slot layout handed to PD transfer, sizing rules, and the pool a ModelRunner
builds for a hybrid model."""

import ctypes

import pytest
import torch

from sglang.srt.mem_cache.mamba_pool import (MambaPool, mamba_cache_size, resolve_mamba_ssm_dtype)

L, CONV, SSM = 3, (12, 3), (4, 2, 5)


def _pool(size=6, dtype=torch.float32, ssm_dtype=None):
    return MambaPool(size, L, CONV, SSM, dtype, ssm_dtype)


def _fill_random(pool, seed=0):
    g = torch.Generator().manual_seed(seed)
    pool.conv_state.copy_(torch.randn(pool.conv_state.shape, generator=g).to(pool.conv_state.dtype))
    pool.ssm_state.copy_(torch.randn(pool.ssm_state.shape, generator=g).to(pool.ssm_state.dtype))


def test_shapes_and_dtypes():
    pool = _pool(size=6, dtype=torch.bfloat16, ssm_dtype=torch.float32)
    assert tuple(pool.conv_state.shape) == (L, 7) + CONV and pool.conv_state.dtype == torch.bfloat16
    assert tuple(pool.ssm_state.shape) == (L, 7) + SSM and pool.ssm_state.dtype == torch.float32
    conv, ssm = pool.layer_states(1)
    assert conv.data_ptr() == pool.conv_state[1].data_ptr() and tuple(ssm.shape) == (7,) + SSM
    assert pool.bytes_per_slot() == L * (12 * 3 * 2 + 4 * 2 * 5 * 4)


def test_alloc_free_never_hands_out_the_padding_slot():
    pool = _pool(size=4)
    assert pool.available_size() == 4
    got = pool.alloc(3)
    assert sorted(got) == [1, 2, 3] and pool.available_size() == 1
    assert pool.alloc(2) is None and pool.available_size() == 1
    last = pool.alloc(1)
    assert last == [4] and pool.available_size() == 0
    pool.free(got[:2])
    pool.free(torch.tensor([last[0]]))
    assert pool.available_size() == 3
    with pytest.raises(ValueError):
        pool.free(0)
    with pytest.raises(ValueError):
        pool.free(5)
    pool.clear()
    assert pool.available_size() == 4 and 0 not in pool.alloc(4)


def test_clear_slot_zeroes_only_that_slot_in_every_layer():
    pool = _pool()
    _fill_random(pool)
    before_c, before_s = pool.conv_state.clone(), pool.ssm_state.clone()
    pool.clear_slot(3)
    pool.clear_slot([5])
    for s in range(7):
        zero = s in (3, 5)
        assert bool((pool.conv_state[:, s] == 0).all()) == zero
        assert bool((pool.ssm_state[:, s] == 0).all()) == zero
        if not zero:
            assert torch.equal(pool.conv_state[:, s], before_c[:, s]) and torch.equal(pool.ssm_state[:, s], before_s[:, s])


def test_copy_from_copies_every_layer_and_leaves_source():
    pool = _pool()
    _fill_random(pool, seed=1)
    src_c, src_s = pool.conv_state[:, 2].clone(), pool.ssm_state[:, 2].clone()
    other = pool.ssm_state[:, 4].clone()
    pool.copy_from(2, 5)
    assert torch.equal(pool.conv_state[:, 5], src_c) and torch.equal(pool.ssm_state[:, 5], src_s)
    assert torch.equal(pool.conv_state[:, 2], src_c) and torch.equal(pool.ssm_state[:, 4], other)
    pool.copy_from(torch.tensor([1, 3]), [6, 4])  # several at once
    assert torch.equal(pool.ssm_state[:, 6], pool.ssm_state[:, 1]) and torch.equal(pool.ssm_state[:, 4], pool.ssm_state[:, 3])


def test_cpu_copy_round_trip_restores_into_another_slot():
    pool = _pool()
    _fill_random(pool, seed=2)
    backup = pool.get_cpu_copy(3)
    expect_c, expect_s = pool.conv_state[:, 3].clone(), pool.ssm_state[:, 3].clone()
    pool.clear_slot(3)  # the slot is reused while the request is retracted
    assert backup[0].device.type == "cpu" and torch.equal(backup[0], expect_c)  # not a view
    pool.load_cpu_copy(backup, 6)
    assert torch.equal(pool.conv_state[:, 6], expect_c) and torch.equal(pool.ssm_state[:, 6], expect_s)


def test_state_tensors_are_slot_major_for_transfer():
    pool = _pool(dtype=torch.bfloat16, ssm_dtype=torch.float32)
    _fill_random(pool, seed=3)
    tensors = pool.state_tensors()
    assert len(tensors) == 2 * L
    ptrs, lens, items = pool.get_contiguous_buf_infos()
    assert items == pool.state_item_lens() and sum(items) == pool.bytes_per_slot()
    for t, ptr, n, item in zip(tensors, ptrs, lens, items):
        assert t.is_contiguous() and t.shape[0] == pool.size + 1 and n == t.nbytes == item * (pool.size + 1)
        # slot s of this state is the `item` bytes at ptr + s * item
        s = 4
        raw = ctypes.string_at(ptr + s * item, item)
        assert raw == t[s].contiguous().view(torch.uint8).numpy().tobytes()
    # The first L entries are the conv states, the rest the SSM states, layer by layer.
    assert tensors[1].data_ptr() == pool.conv_state[1].data_ptr()
    assert tensors[L + 2].data_ptr() == pool.ssm_state[2].data_ptr()


def test_sizing_rules():
    per = 1000
    assert mamba_cache_size(7, 64, False, 10**9, per) == 7  # --max-mamba-cache-size wins
    assert mamba_cache_size(None, 64, False, 10**9, per) == 64  # one slot per running request
    assert mamba_cache_size(None, None, False, 10**9, per) == 512
    # With state prefix caching: mamba / full = ratio of the shared budget.
    assert mamba_cache_size(None, 64, True, 1_900_000, per) == int(1_900_000 * 0.9 / 1.9 // per)
    assert mamba_cache_size(None, 64, True, 1_500_000, per, mamba_full_memory_ratio=0.5) == 500


def test_ssm_dtype_resolution():
    class Cfg:
        mamba_ssm_cache_dtype = "float32"

    assert resolve_mamba_ssm_dtype("bfloat16", Cfg(), torch.float32) == torch.bfloat16
    assert resolve_mamba_ssm_dtype(None, Cfg(), torch.bfloat16) == torch.float32
    assert resolve_mamba_ssm_dtype(None, object(), torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="mamba-ssm-dtype"):
        resolve_mamba_ssm_dtype("int8", None, torch.float32)


@pytest.fixture(scope="module")
def nemo_dir(tmp_path_factory):
    from sglang.test.tiny_models import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("nemo")), "nemotron_h", seed=0)


def test_model_runner_builds_the_pool(nemo_dir):
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

    r = ModelRunner(nemo_dir, max_total_tokens=512, max_running_requests=6, disable_tqdm=True)
    assert r.memory.mamba_pool.size == 6 and r.memory.mamba_pool.ssm_dtype == torch.float32
    # Flags given through server_args (as the server does) and a pool smaller than
    # max_running_requests: a running request needs a slot, so the cap follows the pool.
    sa = ServerArgs(model_path=nemo_dir, max_mamba_cache_size=3, mamba_ssm_dtype="bfloat16", max_total_tokens=512,
                    max_running_requests=6)
    r = ModelRunner(nemo_dir, sa, disable_tqdm=True)
    assert r.memory.mamba_pool.size == 3 and r.memory.max_running_requests == 3
    assert r.memory.mamba_pool.ssm_dtype == torch.bfloat16 and r.memory.mamba_pool.conv_state.dtype == torch.float32
    # No --max-running-requests: upstream's 512 slots, and the runner's request cap follows.
    r = ModelRunner(nemo_dir, max_total_tokens=4096, disable_tqdm=True)
    assert r.memory.mamba_pool.size == 512 and r.memory.max_running_requests == 512


def test_dense_model_has_no_pool(tmp_path):
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.test.tiny_models import make_tiny_model

    r = ModelRunner(make_tiny_model(str(tmp_path / "l"), "llama"), max_total_tokens=256, max_running_requests=4,
                    disable_tqdm=True)
    assert r.memory.mamba_pool is None


def test_pd_kv_args_describe_the_pool_slot_by_slot():
    from sglang.srt.disaggregation.base import kv_args_from_pools
    from sglang.srt.disaggregation.utils import StateType
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    kv = MHATokenToKVPool(size=32, page_size=1, dtype=torch.float32, head_num=2, head_dim=4, layer_ids=[1],
                          device="cpu")
    pool = _pool()
    args = kv_args_from_pools(kv, None, 1, mamba_pool=pool)
    assert args.state_types == [StateType.MAMBA]
    assert args.state_item_lens == [pool.state_item_lens()]
    assert args.state_data_ptrs == [[t.data_ptr() for t in pool.state_tensors()]]
    assert args.state_data_lens == [[t.nbytes for t in pool.state_tensors()]]
