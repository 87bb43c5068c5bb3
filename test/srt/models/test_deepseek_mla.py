"""DeepSeek-V2 / V2-Lite / V3 (multi-head latent attention, DeepSeek's MoE router) against HF
transformers on tiny random checkpoints (sglang/test/tiny_models.py: `deepseek_v2_lite` with
`q_lora_rank: null` and greedy softmax routing, `deepseek_v2` with q LoRA, group-limited routing
and yarn with a cos/sin factor, `deepseek_v3` with sigmoid routing, a random correction bias,
renormalised and scaled weights, interleaved rope and yarn):

- runner level, fp32: the logits of every prompt token (expanded prefill) and of each decode step
  (absorbed form over the latent pool), whole and in 7-token chunks (absorbed over the cached
  chunks), within 1e-4 of HF; the same through the torch fallbacks (no sgl-kernel), and with a
  latent wider than sgl-kernel's heads (real DeepSeek's 512 + 64: torch ops for those layers);
- bf16 checkpoints within bf16's reach of HF in bf16 (most positions within 0.1: a near-tie expert
  choice flips at a few; argmax agreement > 80%);
- through `sglang.Engine` (real scheduler process) with 16-token chunked prefill: HF's greedy
  tokens and first-step logprobs, and the same again from a prefix-cache hit;
- the KV pool keeps the latent once per token: kv_lora_rank + qk_rope_head_dim values per layer,
  not K and V per head, and the retraction backups (host pool, CPU copy) round-trip those bytes;
- a config the router cannot compute is refused at start with one line naming the field.
"""

from __future__ import annotations

import pytest
import torch

from sglang.srt.layers import cpu_ops
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.family_parity import family_dir, family_hf
from sglang.test.hf_parity import assert_trace_close, hf_reference, our_logits, random_prompt
from sglang.test.hf_reference import hf_greedy

ARCHS = ["deepseek_v2_lite", "deepseek_v2", "deepseek_v3"]
PROMPT_LEN = 41


def _runner(path, **kw):
    kw = {"max_total_tokens": 1024, "page_size": 1, "max_running_requests": 4, **kw}
    return ModelRunner(path, disable_tqdm=True, **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_hf_whole_and_chunked(arch):
    prompt = random_prompt(PROMPT_LEN, seed=4)
    ref = hf_reference(family_hf(arch), prompt, 4)
    runner = _runner(family_dir(arch))
    assert_trace_close(our_logits(runner, prompt, ref.tokens), ref)
    assert_trace_close(our_logits(runner, prompt, ref.tokens, chunk_size=7), ref)


def test_torch_fallbacks_match_hf():
    """The torch path (V read as a view of the latent) as well as the compiled kernels."""
    prompt = random_prompt(PROMPT_LEN, seed=6)
    ref = hf_reference(family_hf("deepseek_v3"), prompt, 3)
    runner = _runner(family_dir("deepseek_v3"), page_size=4)
    with cpu_ops.torch_fallbacks():
        assert_trace_close(our_logits(runner, prompt, ref.tokens, chunk_size=9), ref)


def test_latent_wider_than_the_kernels_takes_the_torch_path(tmp_path):
    """Real DeepSeek latents are 512 + 64 wide, past sgl-kernel's 512-wide heads: those layers
    attend with torch ops (here 512 + 8), still HF's logits."""
    from sglang.test.hf_parity import load_hf_model
    from sglang.test.tiny_models import make_tiny_model

    path = make_tiny_model(str(tmp_path / "wide"), "deepseek_v2_lite", seed=2, kv_lora_rank=512, num_hidden_layers=2)
    prompt = random_prompt(19, seed=8)
    ref = hf_reference(load_hf_model(path), prompt, 2)
    assert_trace_close(our_logits(_runner(path), prompt, ref.tokens, chunk_size=8), ref)


@pytest.mark.parametrize("arch", ["deepseek_v2_lite", "deepseek_v3"])
def test_bf16_within_reach_of_hf(arch):
    prompt = random_prompt(PROMPT_LEN, seed=4)
    ref = hf_reference(family_hf(arch, "bfloat16"), prompt, 4)
    ours = our_logits(_runner(family_dir(arch, "bfloat16")), prompt, ref.tokens, chunk_size=16)
    per_pos = (ours.prefill - ref.prefill).abs().max(dim=-1).values
    assert (per_pos < 0.1).float().mean() >= 0.9, per_pos
    assert (ours.prefill.argmax(-1) == ref.prefill.argmax(-1)).float().mean() > 0.8
    for a, b in zip(ours.decode, ref.decode):
        assert (a - b).abs().max() < 0.15


def test_pool_keeps_one_latent_per_token():
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    runner = _runner(family_dir("deepseek_v3"))
    pool, cfg = runner.pools.token_to_kv_pool, runner.model_config
    assert isinstance(pool, MLATokenToKVPool)
    latent = cfg.kv_lora_rank + cfg.qk_rope_head_dim  # 32 + 8
    assert [tuple(b.shape[1:]) for b in pool.kv_buffers()] == [(1, latent)] * 3
    assert pool.bytes_per_token() == runner.kv_bytes_per_token() == 3 * latent * 4
    per_head = 3 * cfg.num_attention_heads * (16 + 8 + 16) * 4  # K (Dn + R) and V per head, fp32
    assert pool.bytes_per_token() * 4 <= per_head
    assert pool.layout().startswith("mla:")


@pytest.mark.parametrize("backend", ["host_pool", "cpu_tensor"])
def test_retraction_backup_round_trips_the_latent(backend):
    from sglang.srt.mem_cache.host_pool import HostKVPool
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.retraction_backup import RetractionBackupStore

    pool = MLATokenToKVPool(size=64, page_size=4, dtype=torch.float32, kv_lora_rank=32, qk_rope_head_dim=8,
                            layer_ids=[0, 1])
    host = HostKVPool(pool, 32, 4) if backend == "host_pool" else None
    if host is not None:  # the host pool takes the device pool's rows and page size
        assert [tuple(b.shape) for b in host.buffers] == [(36, 1, 40)] * 2
    store = RetractionBackupStore(backend, pool, None, host_pool=host)
    src = torch.arange(4, 14)
    for layer in (0, 1):
        pool.set_kv_buffer(layer, src, torch.randn(10, 40))
    saved = [pool.get_key_buffer(layer)[src].clone() for layer in (0, 1)]
    backup = store.backup(src)
    for layer in (0, 1):  # the slots are reused meanwhile
        pool.set_kv_buffer(layer, src, torch.zeros(10, 40))
    dst = torch.arange(20, 30)
    store.restore(backup, dst)
    for layer in (0, 1):
        torch.testing.assert_close(pool.get_key_buffer(layer)[dst], saved[layer], rtol=0, atol=0)
        torch.testing.assert_close(pool.get_value_buffer(layer)[dst], saved[layer][..., :32], rtol=0, atol=0)
    assert store.num_live == 0 and (host is None or host.available_size() == 32)


@pytest.mark.parametrize("field,value,named", [
    ("scoring_func", "softmax", "scoring_func"),
    ("n_group", 3, "n_group"),
    ("hidden_act", "gelu", "hidden_act"),
    ("moe_layer_freq", 2, "moe_layer_freq"),
    ("quantization_config", {"quant_method": "fp8"}, "quantization_config"),
])
def test_unsupported_router_config_is_refused(field, value, named):
    from transformers import AutoConfig

    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    cfg = AutoConfig.from_pretrained(family_dir("deepseek_v3"))
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=named):
        DeepseekV3ForCausalLM(cfg)


def test_start_refuses_a_router_it_cannot_compute(tmp_path):
    """Start-up's check (before any process is spawned) reads config.json: one line naming the field."""
    import json
    import shutil

    from sglang.srt.model_loader.loader import ModelConfigError, check_model_servable

    src = family_dir("deepseek_v2")
    check_model_servable(src)
    shutil.copy(f"{src}/config.json", tmp_path / "config.json")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["topk_method"] = "noaux_tc"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="topk_method='noaux_tc' is not supported for DeepseekV2"):
        check_model_servable(str(tmp_path))


@pytest.fixture(scope="module", params=["deepseek_v2_lite", "deepseek_v3"])
def engine(request):
    import sglang

    arch = request.param
    eng = sglang.Engine(model_path=family_dir(arch), max_total_tokens=1024, dtype="float32", chunked_prefill_size=16,
                        max_running_requests=4)
    yield arch, eng
    eng.shutdown()


@pytest.mark.server
def test_engine_greedy_first_step_logprobs_and_prefix_hit(engine):
    arch, eng = engine
    prompt = random_prompt(PROMPT_LEN, seed=11)
    params = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
    hf = family_hf(arch)
    expected = hf_greedy(hf, prompt, 8)
    with torch.no_grad():
        first = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1].float(), -1)
    outs = [eng.generate(input_ids=prompt, sampling_params=params, return_logprob=True, top_logprobs_num=5)
            for _ in range(2)]
    for out in outs:
        assert out["output_ids"] == expected
        top = out["meta_info"]["output_top_logprobs"][0]
        ref_vals, ref_ids = first.topk(5)
        assert [t[1] for t in top] == ref_ids.tolist()
        torch.testing.assert_close(torch.tensor([t[0] for t in top]), ref_vals, atol=1e-4, rtol=1e-4)
    assert outs[0]["meta_info"]["cached_tokens"] == 0 and outs[1]["meta_info"]["cached_tokens"] > 0


def test_triton_backend_refuses_mla_at_start():
    from sglang.srt.layers.attention.base_attn_backend import AttentionInputs
    from sglang.srt.layers.attention.registry import create_attention_backend
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool

    pool = MLATokenToKVPool(16, 1, torch.float32, kv_lora_rank=32, qk_rope_head_dim=8, layer_ids=[0])
    with pytest.raises(ValueError, match="triton does not run MLA models"):
        create_attention_backend("triton", AttentionInputs(req_to_token_pool=ReqToTokenPool(2, 16),
                                                           token_to_kv_pool=pool))
