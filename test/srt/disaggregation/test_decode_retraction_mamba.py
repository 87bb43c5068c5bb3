"""PD decode retraction on Mamba2-hybrid models: `cpu_tensor` backs up the KV *and* the request's
Mamba state, frees both, and restores them into new slots on resume; outputs must equal HF's
greedy tokens with no prompt recomputed (a lost or stale state would change them), and no KV,
row or Mamba slot may leak. The decode server runs with the `fake` transfer backend (local
prefill stands in for the transfer). Host-pool retraction is refused for these models.
Then a prefill and a decode scheduler in one process exchange KV + Mamba state over the real
Mooncake engine (TCP): HF's greedy tokens; a decode peer with other slot sizes is refused."""


import pytest

from sglang.check_server_args import main as check_server_args_main
from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.scheduler_utils import InProcessPD, make_scheduler, random_prompts, run_to_completion, submit
from sglang.test.tiny_models import make_tiny_model

SEED_MESSAGE = "Host-pool retraction does not support Mamba models."


@pytest.fixture(scope="module", params=["nemotron_h", "falcon_h1", "qwen3_next"])
def arch_models(request, tmp_path_factory):
    d = make_tiny_model(str(tmp_path_factory.mktemp("decode_" + request.param)), request.param, seed=5)
    return request.param, d, load_hf_model(d)


def decode_scheduler(model_dir, backup, **kw):
    args = dict(max_total_tokens=260, page_size=1, chunked_prefill_size=64, disaggregation_mode="decode", disaggregation_transfer_backend="fake", num_reserved_decode_tokens=8,
                max_running_requests=8)
    if backup is not None:
        args["disaggregation_decode_retraction_backup"] = backup
    args.update(kw)
    return make_scheduler(model_dir, **args)






def prompts(n, length, seed):
    return random_prompts([length] * n, seed, vocab_hi=1000)


@pytest.mark.parametrize("backup", [None, "cpu_tensor"])
def test_cpu_tensor_retraction_restores_kv_and_mamba_state(arch_models, backup):
    arch, d, hf = arch_models
    sched = decode_scheduler(d, backup)
    assert sched.server_args.disaggregation_decode_retraction_backup == "cpu_tensor"  # auto rule too
    ps = prompts(6, 30, seed=21)
    reqs = [submit(sched, f"d{i}", p, 40) for i, p in enumerate(ps)]
    run_to_completion(sched)
    assert sum(r.num_retractions for r in reqs) > 0
    assert sched.stats.num_recomputed_tokens == 0
    for r, p in zip(reqs, ps):
        assert r.finished_reason.to_json() == {"type": "length", "length": 40}
        assert r.output_ids == hf_greedy(hf, p, 40), r.rid
    assert sched.memory.retraction_store.num_live == 0
    assert sched.memory.allocator.available_size() + sched.memory.tree_cache.evictable_size() == sched.memory.init_free_kv
    assert sched.memory.req_to_token_pool.available_size() == sched.memory.req_to_token_pool.size
    from sglang.srt.mem_cache.unified_radix_cache import EvictParams

    sched.memory.tree_cache.evict(EvictParams(num_tokens=sched.memory.init_free_kv))
    assert sched.memory.mamba_pool.available_size() == sched.memory.mamba_pool.size


def test_host_pool_is_rejected_at_start_and_by_check_server_args(arch_models, capsys):
    arch, d, hf = arch_models
    with pytest.raises(ValueError) as e:
        decode_scheduler(d, "host_pool")
    assert str(e.value) == SEED_MESSAGE
    rc = check_server_args_main(["--model-path", d, "--disaggregation-mode", "decode",
                                 "--disaggregation-decode-retraction-backup", "host_pool"])
    out = capsys.readouterr()
    assert rc != 0
    assert SEED_MESSAGE in out.out + out.err
    # the opt-in is the only way past it
    assert check_server_args_main(["--model-path", d, "--disaggregation-mode", "decode",
                                   "--disaggregation-decode-retraction-backup", "host_pool",
                                   "--enable-mamba-host-pool-backup"]) == 0


# ---- host_pool for SSM hybrids (--enable-mamba-host-pool-backup, beyond upstream) ----------------
@pytest.mark.parametrize("auto", [False, True])
def test_host_pool_backs_up_kv_and_mamba_state_with_the_opt_in(arch_models, auto):
    """KV pages to the host KV pool, the Mamba state to a host state slot; resumed with zero
    recomputed tokens and HF's greedy tokens; both tiers free afterwards. `auto`: without the backup
    flag the decode server picks host_pool for a hybrid once the opt-in is on."""
    from sglang.test.scheduler_utils import assert_no_leak

    arch, d, hf = arch_models
    sched = decode_scheduler(d, None if auto else "host_pool", enable_mamba_host_pool_backup=True)
    store = sched.memory.retraction_store
    assert sched.server_args.disaggregation_decode_retraction_backup == "host_pool"
    assert store.host_mamba_pool is not None
    assert store.host_mamba_pool.conv_state.dtype == sched.memory.mamba_pool.conv_state.dtype
    assert store.host_mamba_pool.size == min(sched.memory.mamba_pool.size, store.host_pool.size)  # page size 1
    ps = prompts(6, 30, seed=21)
    reqs = [submit(sched, f"h{i}", p, 40) for i, p in enumerate(ps)]
    run_to_completion(sched)
    assert sum(r.num_retractions for r in reqs) > 0
    assert sched.stats.num_recomputed_tokens == 0
    for r, p in zip(reqs, ps):
        assert r.finished_reason.to_json() == {"type": "length", "length": 40}
        assert r.output_ids == hf_greedy(hf, p, 40), r.rid
    stats = sched.memory.stats()["retraction_backup"]
    assert stats["mamba_host_slots_free"] == stats["mamba_host_slots_total"] == store.host_mamba_pool.size
    assert_no_leak(sched)


def test_exhausted_host_state_tier_aborts_like_the_kv_tier(arch_models):
    from sglang.srt.mem_cache.retraction_backup import HOST_POOL_EXHAUSTED
    from sglang.test.scheduler_utils import assert_no_leak

    arch, d, hf = arch_models
    sched = decode_scheduler(d, "host_pool", enable_mamba_host_pool_backup=True, mamba_host_pool_slots=0)
    reqs = [submit(sched, f"x{i}", p, 40) for i, p in enumerate(prompts(6, 30, seed=21))]
    run_to_completion(sched)
    aborted = [r for r in reqs if r.finished_reason.to_json()["type"] == "abort"]
    assert aborted and all(r.finished_reason.to_json()["message"] == HOST_POOL_EXHAUSTED for r in aborted)
    assert all(r.finished_reason.to_json()["status_code"] == 500 for r in aborted)
    assert_no_leak(sched)


def test_hundred_backup_cycles_leak_nothing(arch_models):
    """Backup / restore and backup / discard (abort while retracted), 100 times each, on the real
    pools: every host page and state slot comes back, and a restore gives back the exact state."""
    import torch

    arch, d, hf = arch_models
    sched = decode_scheduler(d, "host_pool", enable_mamba_host_pool_backup=True)
    memory, store = sched.memory, sched.memory.retraction_store
    for cycle in range(100):
        (slot,) = memory.mamba_pool.alloc(1)
        kv = memory.allocator.alloc(5)
        memory.mamba_pool.conv_state[:, slot].normal_()
        memory.mamba_pool.ssm_state[:, slot].normal_()
        conv, ssm = memory.mamba_pool.conv_state[:, slot].clone(), memory.mamba_pool.ssm_state[:, slot].clone()
        backup = store.backup(kv, slot)
        assert backup is not None and backup.mamba_host_slot is not None
        memory.mamba_pool.clear_slot([slot])
        if cycle % 2:
            store.discard(backup)
        else:
            store.restore(backup, kv, slot)
            assert torch.equal(memory.mamba_pool.conv_state[:, slot], conv)
            assert torch.equal(memory.mamba_pool.ssm_state[:, slot], ssm)
        memory.mamba_pool.free([slot])
        memory.allocator.free(kv)
    assert store.num_live == 0
    assert store.host_mamba_pool.available_size() == store.host_mamba_pool.size
    assert store.host_pool.available_size() == store.host_pool.size


# ---- 1P1D over the real Mooncake engine (TCP on loopback), both schedulers in this process -------
def test_1p1d_mooncake_transfers_the_mamba_state(arch_models):
    pytest.importorskip("mooncake.engine")
    arch, d, hf = arch_models
    pd = InProcessPD(d)
    prefill, decode = pd.prefill, pd.decode
    try:
        ps = prompts(3, 37, seed=31)  # 3 prefill chunks each: the state crosses chunks, then the wire
        dreqs = pd.run(ps, 8)
        for r, p in zip(dreqs, ps):
            assert r.finished_reason.to_json() == {"type": "length", "length": 8}, r.finished_reason.to_json()
            assert r.output_ids == hf_greedy(hf, p, 8), r.rid
        # The same prompt again: the prefill server starts from its cached state after 32 tokens
        # (copy-on-write into the request's slot) and sends that request's state.
        again = pd.run(ps[:1], 8, room0=8000)[0]
        assert again.output_ids == dreqs[0].output_ids and again.cached_tokens == 32
        assert decode.memory.mamba_pool.available_size() == decode.memory.mamba_pool.size
        from sglang.srt.mem_cache.unified_radix_cache import EvictParams

        prefill.memory.tree_cache.evict(EvictParams(num_tokens=prefill.memory.init_free_kv))
        assert prefill.memory.mamba_pool.available_size() == prefill.memory.mamba_pool.size
    finally:
        pd.close()


def test_1p1d_mamba_slot_size_mismatch_is_refused_at_registration(arch_models):
    pytest.importorskip("mooncake.engine")
    arch, d, hf = arch_models
    if arch != "nemotron_h":
        pytest.skip("one model is enough")
    pd = InProcessPD(d, decode_kw={"mamba_ssm_dtype": "bfloat16"})  # half-size SSM slots
    prefill, decode = pd.prefill, pd.decode
    try:
        dreqs = pd.run(prompts(2, 20, seed=32), 4)
        for r in dreqs:
            msg = r.finished_reason.to_json()
            assert msg["type"] == "abort" and "Prefill/Decode Mamba slot size mismatch" in msg["message"], msg
        assert prefill.forward_ct == 0  # refused before any prefill ran
        assert decode.memory.mamba_pool.available_size() == decode.memory.mamba_pool.size
    finally:
        pd.close()


def _tree_states(sched):
    """{node id: (node, slot, conv, ssm)} for every tree node holding a Mamba state."""
    from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

    pool, out, stack = sched.memory.mamba_pool, {}, [sched.memory.tree_cache.core.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        slot = None if node.is_root else MambaComponent.slot_of(node)
        if slot is not None:
            out[node.id] = (node, slot, pool.conv_state[:, slot].clone(), pool.ssm_state[:, slot].clone())
    return out


def test_decode_radix_cache_hits_around_host_pool_retraction(arch_models):
    """--disaggregation-decode-enable-radix-cache with host-pool backups of a hybrid: the second
    turn's prompts (first prompt + its output + more) hit the decode server's tree, so the prefill
    sends only the pages after the hit; under memory pressure the requests retract and resume from
    the host pools into *new* state slots while the tree's nodes keep their slots and contents;
    a third turn hits again. Every output is HF's greedy continuation; nothing leaks, no lock stays."""
    import torch

    pytest.importorskip("mooncake.engine")
    from sglang.test.scheduler_utils import assert_no_leak

    arch, d, hf = arch_models
    pd = InProcessPD(d, decode_kw=dict(
        max_total_tokens=340, num_reserved_decode_tokens=8, disaggregation_decode_enable_radix_cache=True,
        disaggregation_decode_retraction_backup="host_pool", enable_mamba_host_pool_backup=True))
    decode = pd.decode
    try:
        assert not decode.memory.tree_cache.disable
        first = prompts(5, 30, seed=41)
        turn1 = pd.run(first, 20)
        assert decode.role.stats()["decode_radix_hit_tokens"] == 0
        before = _tree_states(decode)
        assert len(before) == 5  # finished requests left their KV and final state in the tree 

        second = [p + r.output_ids + [7, 8, 9, 10, 11, 12] for p, r in zip(first, turn1)]
        tree_slots_ok = []

        def check_slots():  # a running request never writes a tree node's slot
            tree_slots = {slot for _, slot, _, _ in _tree_states(decode).values()}
            tree_slots_ok.append(all(r.kv.mamba_pool_idx not in tree_slots for r in decode.running_reqs))

        turn2 = pd.run(second, 40, room0=7100, on_step=check_slots)
        hits = decode.role.stats()["decode_radix_hit_tokens"]
        assert hits >= 3 * 49, hits  # second-turn prompts reused 49 tokens (prompt + output - 1) where still cached
        assert sum(r.num_retractions for r in turn2) > 0 and decode.stats.num_recomputed_tokens == 0
        assert all(tree_slots_ok)
        for r, p in zip(turn2, second):
            assert r.finished_reason.to_json() == {"type": "length", "length": 40}, r.finished_reason.to_json()
            assert r.output_ids == hf_greedy(hf, p, 40), r.rid
        after = _tree_states(decode)
        kept = [k for k in before if k in after and after[k][1] == before[k][1]]
        for k in kept:  # nodes that survived the pressure hold the very state they held
            assert torch.equal(after[k][2], before[k][2]) and torch.equal(after[k][3], before[k][3])

        # A request that was retracted and restored left its whole KV and state in the tree on
        # finishing: its continuation hits there.
        k = max(i for i, r in enumerate(turn2) if r.num_retractions > 0)
        third = [second[k] + turn2[k].output_ids + [13, 14]]
        turn3 = pd.run(third, 8, room0=7200)
        assert decode.role.stats()["decode_radix_hit_tokens"] - hits == len(second[k]) + 40 - 1
        assert turn3[0].output_ids == hf_greedy(hf, third[0], 8)
        assert_no_leak(decode)
    finally:
        pd.close()
