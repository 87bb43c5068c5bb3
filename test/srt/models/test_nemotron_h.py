"""NemotronHForCausalLM (Mamba2 + attention + MLP blocks) vs HF transformers, fp32, tiny random
weights: logits of every prompt token and every decode step, with the Mamba2 state carried in
MambaPool slots (SSD chunk of 8 tokens, so prompts span many chunks), chunked prefill, ragged
batches with non-contiguous slots, and greedy tokens identical to HF's generate."""

import pytest
import torch

from mamba_hybrid_driver import HybridDriver, hybrid_batch_logits, hybrid_greedy, hybrid_logits
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.hf_parity import assert_trace_close, hf_reference, load_hf_model, random_prompt
from sglang.test.tiny_models import make_tiny_model

N_DECODE = 6
PATTERN = "M*M-M*-"


@pytest.fixture(scope="module")
def nemo_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("nemotron_h")), "nemotron_h", seed=1)


@pytest.fixture(scope="module")
def hf_nemo(nemo_dir):
    return load_hf_model(nemo_dir)


def _runner(path, page_size=1, **kw):
    return ModelRunner(path, max_total_tokens=4096, page_size=page_size, max_running_requests=8,
                       disable_tqdm=True, **kw)


@pytest.fixture(scope="module")
def runner(nemo_dir):
    return _runner(nemo_dir)


def test_model_config_reads_transformers5_layers_block_type(nemo_dir):
    # transformers 5 saves the pattern as `layers_block_type` (no num_hidden_layers).
    cfg = ModelConfig.from_path(nemo_dir)
    assert "hybrid_override_pattern" not in cfg.hf_config and "layers_block_type" in cfg.hf_config
    assert cfg.num_hidden_layers == len(PATTERN)
    assert cfg.attention_layer_ids == [i for i, c in enumerate(PATTERN) if c == "*"]
    assert cfg.is_hybrid_ssm
    # NVIDIA's own config form still works the same way.
    old = ModelConfig.from_dict({"architectures": ["NemotronHForCausalLM"], "hybrid_override_pattern": "M*M-",
                                 "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4})
    assert (old.num_hidden_layers, old.attention_layer_ids, old.is_hybrid_ssm) == (4, [1], True)


def test_runner_builds_kv_only_for_attention_layers_and_a_mamba_pool(runner):
    assert runner.memory.token_to_kv_pool.layer_ids == [1, 5]
    pool = runner.memory.mamba_pool
    assert pool.num_mamba_layers == PATTERN.count("M")
    assert pool.size == runner.memory.max_running_requests == 8
    assert tuple(pool.conv_state.shape) == (3, 9, 64 + 2 * 2 * 16, 3)
    assert tuple(pool.ssm_state.shape) == (3, 9, 8, 8, 16)


def test_prefill_and_decode_match_hf(hf_nemo, runner):
    prompt = random_prompt(45, seed=0)  # > 5 SSD chunks
    ref = hf_reference(hf_nemo, prompt, N_DECODE)
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens), ref)


@pytest.mark.parametrize("chunk", [5, 8, 16])
def test_chunked_prefill_carries_state(hf_nemo, runner, chunk):
    prompt = random_prompt(37, seed=1)
    ref = hf_reference(hf_nemo, prompt, 3)
    whole = hybrid_logits(runner, prompt, ref.tokens)
    chunked = hybrid_logits(runner, prompt, ref.tokens, chunk_size=chunk)
    torch.testing.assert_close(chunked.prefill, whole.prefill, atol=1e-5, rtol=1e-5)
    assert_trace_close(chunked, ref)


@pytest.mark.parametrize("page_size", [1, 16])
def test_ragged_batch_then_batched_decode_in_scattered_slots(nemo_dir, hf_nemo, page_size):
    prompts = [random_prompt(n, seed=10 + n) for n in (1, 7, 33, 50)]
    refs = [hf_reference(hf_nemo, p, 4) for p in prompts]
    traces = hybrid_batch_logits(_runner(nemo_dir, page_size), prompts, [r.tokens for r in refs], slot_stride=2)
    for ours, ref in zip(traces, refs):
        assert_trace_close(ours, ref)


def test_continuation_and_fresh_request_in_one_extend(hf_nemo, runner):
    """One EXTEND mixes a chunked-prefill continuation (state read from its slot) and a new
    request (state from zeros), then both decode together."""
    a, b = random_prompt(29, seed=3), random_prompt(12, seed=4)
    ref_a, ref_b = hf_reference(hf_nemo, a, 3), hf_reference(hf_nemo, b, 3)
    drv = HybridDriver(runner)
    ra = drv.new_request(a)
    try:
        first = drv.extend([ra], [a[:17]]).full_logits
        rb = drv.new_request(b)
        out = drv.extend([ra, rb], [a[17:], b]).full_logits
        torch.testing.assert_close(torch.cat([first, out[:12]]), ref_a.prefill, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out[12:], ref_b.prefill, atol=1e-4, rtol=1e-4)
        for step in range(3):
            dec = drv.decode([ra, rb], [ref_a.tokens[step], ref_b.tokens[step]]).next_token_logits
            torch.testing.assert_close(dec[0], ref_a.decode[step], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(dec[1], ref_b.decode[step], atol=1e-4, rtol=1e-4)
        drv.free(rb)
    finally:
        drv.free(ra)


def test_decode_step_inside_an_extend_batch(hf_nemo, runner):
    """Mixed batches run a decoding request as a 1-token EXTEND next to a prefill: its state
    continues from the slot exactly as in DECODE."""
    a, b = random_prompt(15, seed=8), random_prompt(9, seed=9)
    ref_a, ref_b = hf_reference(hf_nemo, a, 2), hf_reference(hf_nemo, b, 1)
    drv = HybridDriver(runner)
    ra = drv.new_request(a)
    rb = drv.new_request(b)
    try:
        drv.extend([ra], [a])
        out = drv.extend([ra, rb], [[ref_a.tokens[0]], b]).full_logits
        torch.testing.assert_close(out[0], ref_a.decode[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out[1:], ref_b.prefill, atol=1e-4, rtol=1e-4)
        dec = drv.decode([ra, rb], [ref_a.tokens[1], ref_b.tokens[0]]).next_token_logits
        torch.testing.assert_close(dec[0], ref_a.decode[1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(dec[1], ref_b.decode[0], atol=1e-4, rtol=1e-4)
    finally:
        drv.free(ra)
        drv.free(rb)


def test_bfloat16_runs_close_to_fp32(nemo_dir, runner):
    prompt = random_prompt(30, seed=10)
    fp32 = hybrid_logits(runner, prompt, [])
    bf16_runner = _runner(nemo_dir, dtype="bfloat16")
    assert bf16_runner.memory.mamba_pool.conv_state.dtype == torch.bfloat16
    assert bf16_runner.memory.mamba_pool.ssm_state.dtype == torch.float32  # the checkpoint's mamba_ssm_cache_dtype
    bf16 = hybrid_logits(bf16_runner, prompt, [1, 2])
    assert bf16.prefill.dtype == torch.float32
    assert (bf16.prefill - fp32.prefill).abs().max() < 0.15
    assert (bf16.prefill.argmax(-1) == fp32.prefill.argmax(-1)).float().mean() > 0.8


def test_fresh_request_ignores_stale_slot_state(runner):
    """A request without a cached prefix never reads its slot, whatever the slot holds."""
    prompt = random_prompt(20, seed=5)
    clean = hybrid_logits(runner, prompt, [])
    pool = runner.memory.mamba_pool
    pool.conv_state.fill_(3.0)
    pool.ssm_state.fill_(-7.0)
    drv = HybridDriver(runner)
    req = drv.new_request(prompt)
    pool.conv_state.fill_(3.0)  # undo new_request's clear: the slot is dirty
    pool.ssm_state.fill_(-7.0)
    try:
        dirty = drv.extend([req], [prompt]).full_logits
    finally:
        drv.free(req)
    torch.testing.assert_close(dirty, clean.prefill, atol=1e-5, rtol=1e-5)


def test_greedy_tokens_match_hf_generate(hf_nemo, runner):
    prompt = random_prompt(26, seed=6)
    n = 12
    hf_out = hf_nemo.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              use_cache=True, pad_token_id=0)
    assert hybrid_greedy(runner, prompt, n) == hf_out[0, len(prompt):].tolist()


def test_states_live_in_the_requests_slot(runner):
    """Prefill writes the final conv/SSM state of every Mamba layer into the request's slot
    and nowhere else; decode advances that slot."""
    pool = runner.memory.mamba_pool
    pool.conv_state.zero_()
    pool.ssm_state.zero_()
    drv = HybridDriver(runner, slot_stride=2)
    req = drv.new_request(random_prompt(10, seed=7))
    try:
        slot = drv.slot_of_row[req.req_pool_idx]
        drv.extend([req], [req.token_ids])
        others = [s for s in range(pool.size + 1) if s != slot]
        assert pool.ssm_state[:, others].abs().sum() == 0 and pool.conv_state[:, others].abs().sum() == 0
        assert (pool.ssm_state[:, slot].flatten(1).abs().sum(1) > 0).all()
        before = pool.ssm_state[:, slot].clone()
        drv.decode([req], [5])
        assert not torch.equal(before, pool.ssm_state[:, slot])
        assert pool.ssm_state[:, others].abs().sum() == 0
    finally:
        drv.free(req)
        drv.release_spacers()


@pytest.mark.parametrize("mode", ["extend", "decode"])
def test_padding_rows_leave_every_slot_alone(hf_nemo, runner, mode):
    """A row whose slot is PAD_SLOT_ID (-1) reads no state and writes none; the real rows of
    the same batch are unaffected."""
    a, b = random_prompt(11, seed=11), random_prompt(6, seed=12)
    ref_a = hf_reference(hf_nemo, a, 1)
    drv = HybridDriver(runner)
    ra, rb = drv.new_request(a), drv.new_request(b)
    slot_b = drv.slot_of_row[rb.req_pool_idx]
    try:
        if mode == "decode":
            drv.extend([ra, rb], [a, b])
        pool = runner.memory.mamba_pool
        pool.conv_state[:, 0] = 5.0  # padding slot: must stay as is
        pool.ssm_state[:, 0] = 5.0
        snap_c, snap_s = pool.conv_state.clone(), pool.ssm_state.clone()
        drv.slot_of_row[rb.req_pool_idx] = -1
        if mode == "extend":
            out = drv.extend([ra, rb], [a, b]).full_logits
            torch.testing.assert_close(out[: len(a)], ref_a.prefill, atol=1e-4, rtol=1e-4)
        else:
            out = drv.decode([ra, rb], [ref_a.tokens[0], 7]).next_token_logits
            torch.testing.assert_close(out[0], ref_a.decode[0], atol=1e-4, rtol=1e-4)
        slot_a = drv.slot_of_row[ra.req_pool_idx]
        untouched = [s for s in range(pool.size + 1) if s != slot_a]
        assert torch.equal(pool.conv_state[:, untouched], snap_c[:, untouched])
        assert torch.equal(pool.ssm_state[:, untouched], snap_s[:, untouched])
    finally:
        drv.slot_of_row[rb.req_pool_idx] = slot_b
        drv.free(ra)
        drv.free(rb)


def test_missing_mamba_indices_is_a_clear_error(runner):
    from sglang.srt.model_executor.forward_batch import ForwardBatch

    rows = runner.memory.req_to_token_pool.alloc(1)
    loc = runner.memory.allocator.alloc_extend([0], [3], [0])
    runner.memory.req_to_token_pool.write(rows[0], 0, loc)
    try:
        fb = ForwardBatch.for_extend([[1, 2, 3]], [0], rows, loc)
        with pytest.raises(ValueError, match="mamba_pool_indices"):
            runner.forward(fb)
    finally:
        runner.memory.allocator.free(loc)
        runner.memory.req_to_token_pool.free(rows[0])


@pytest.mark.parametrize("overrides", [
    dict(time_step_min=0.5),  # the scan clamps dt to >= time_step_min; HF's decode step does not
    dict(n_groups=1, use_conv_bias=False, use_bias=True, hybrid_override_pattern="*MM-"),
])
def test_variants_match_hf(tmp_path, overrides):
    path = make_tiny_model(str(tmp_path / "v"), "nemotron_h", seed=7, **overrides)
    prompt = random_prompt(19, seed=8)
    ref = hf_reference(path, prompt, 4)
    runner = _runner(path)
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens), ref)
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens, chunk_size=5), ref)


MOE = dict(hybrid_override_pattern="ME*E-", n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
           moe_shared_expert_intermediate_size=40, n_group=4, topk_group=2, routed_scaling_factor=1.7)


@pytest.mark.parametrize("extra", [{}, dict(moe_latent_size=32, norm_topk_prob=False)])
def test_moe_blocks_match_hf(tmp_path, extra):
    path = make_tiny_model(str(tmp_path / "moe"), "nemotron_h", seed=5, **MOE, **extra)
    hf = load_hf_model(path)
    # Non-zero routing biases (HF initialises them to zero), so the corrected choice matters.
    g = torch.Generator().manual_seed(0)
    for layer in hf.model.layers:
        if layer.block_type == "moe":
            layer.mixer.gate.e_score_correction_bias.copy_(torch.rand(8, generator=g) * 0.5)
    hf.save_pretrained(path)
    prompt = random_prompt(21, seed=6)
    ref = hf_reference(hf, prompt, 4)
    runner = _runner(path)
    assert runner.memory.token_to_kv_pool.layer_ids == [2]
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens), ref)
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens, chunk_size=6), ref)
