"""ModelRunner: options from a ServerArgs-like object (+ keyword overrides), KV pool sizing
(explicit tokens or a fraction of available host memory, page-aligned), start-up logs, and
greedy generation straight through the runner equal to HF generate."""

import json
import logging
import os
import shutil

import psutil
import pytest

from sglang.srt.server_args import ServerArgs
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.hf_parity import load_hf_model, random_prompt
from sglang.test.runner_utils import greedy_generate
from sglang.test.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("m")), "qwen3_swa", seed=12)


def test_server_args_object_and_pool_shapes(model_dir, caplog):
    args = ServerArgs(model_path=model_dir, dtype="auto", page_size=16, max_total_tokens=1000, mem_fraction_static=None,
                      max_running_requests=5, context_length=300, attention_backend=None, device="cpu",
                      disable_hybrid_swa_memory=True)
    with caplog.at_level(logging.INFO):
        r = ModelRunner(ModelConfig.from_path(model_dir), args)
    assert r.server_args is args
    assert (r.device, r.memory.page_size, r.dtype) == ("cpu", 16, torch.float32)
    assert r.memory.max_total_num_tokens == 992  # page-aligned down
    assert r.memory.max_running_requests == 5 and r.memory.req_to_token_pool.size == 5
    assert r.model_config.context_len == 300
    assert tuple(r.memory.req_to_token_pool.req_to_token.shape) == (5, 304)
    pool = r.memory.token_to_kv_pool
    assert pool.layer_ids == [0, 1, 2, 3]
    assert tuple(pool.get_key_buffer(3).shape) == (992 + 16, 2, 16)
    assert r.memory.allocator.available_size() == 992
    assert isinstance(r.attn_backend, TorchNativeAttnBackend)
    assert "KV Cache is allocated. #tokens: 992, K size: 0.00 GB, V size: 0.00 GB" in caplog.text
    assert "#tokens in KV pool: 992" in caplog.text
    assert "Load weight end. type=Qwen3ForCausalLM, dtype=torch.float32" in caplog.text
    # keyword overrides win over the object
    r2 = ModelRunner(model_dir, args, page_size=1, max_total_tokens=40)
    assert (r2.memory.page_size, r2.memory.max_total_num_tokens) == (1, 40)


def test_pool_sized_from_memory_fraction(model_dir):
    frac = 0.0005
    r = ModelRunner(model_dir, mem_fraction_static=frac, page_size=16, max_running_requests=4, disable_tqdm=True)
    per_token = 4 * 2 * 16 * 2 * 4  # layers * kv_heads * head_dim * (K+V) * fp32
    assert r.kv_bytes_per_token() == per_token
    expected = frac * psutil.virtual_memory().available / per_token
    assert r.memory.max_total_num_tokens % 16 == 0
    assert abs(r.memory.max_total_num_tokens - expected) < 0.05 * expected + 16


def test_default_max_running_requests(model_dir):
    r = ModelRunner(model_dir, max_total_tokens=64, disable_tqdm=True)
    # upstream's rule min(max(tokens / context_len * 512, 2048), 4096), bounded by the pool
    assert r.memory.max_running_requests == 64
    r = ModelRunner(model_dir, max_total_tokens=8192, disable_tqdm=True, context_length=128)
    assert r.memory.max_running_requests == 4096 and r.memory.req_to_token_pool.size == 4096


def test_unsupported_architecture_fails_at_start(model_dir, tmp_path):
    bad = str(tmp_path / "bad")
    shutil.copytree(model_dir, bad)
    cfg_path = os.path.join(bad, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["architectures"] = ["GPT2LMHeadModel"]
    cfg["model_type"] = "gpt2"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*not supported.*Supported architectures: .*LlamaForCausalLM"):
        ModelRunner(bad, max_total_tokens=64, disable_tqdm=True)


@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_generation_equals_hf_generate(model_dir, page_size):
    prompt = random_prompt(30, seed=13)
    hf = load_hf_model(model_dir)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    r = ModelRunner(model_dir, max_total_tokens=256, page_size=page_size, disable_tqdm=True)
    free0 = r.memory.allocator.available_size()
    assert greedy_generate(r, prompt, 12) == ref
    assert r.memory.allocator.available_size() == free0  # helper returned every slot


def test_idle_batch_returns_empty_logits(model_dir):
    from sglang.srt.model_executor.forward_batch import ForwardBatch, ForwardMode

    r = ModelRunner(model_dir, max_total_tokens=64, disable_tqdm=True)
    empty = torch.empty(0, dtype=torch.int64)
    fb = ForwardBatch(ForwardMode.IDLE, 0, empty, empty, empty, empty, empty, [])
    out = r.forward(fb)
    assert tuple(out.next_token_logits.shape) == (0, r.model_config.vocab_size)


def test_hybrid_swa_pool_is_opt_in(model_dir, caplog):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    r = ModelRunner(model_dir, max_total_tokens=160, page_size=16, disable_tqdm=True, disable_hybrid_swa_memory=True)
    assert not r.memory.is_hybrid_swa and isinstance(r.memory.token_to_kv_pool, MHATokenToKVPool)
    with caplog.at_level(logging.INFO):
        r = ModelRunner(model_dir, max_total_tokens=160, page_size=16, disable_tqdm=True)
    assert r.memory.is_hybrid_swa and isinstance(r.memory.token_to_kv_pool, SWAKVPool)
    assert r.memory.swa_max_total_num_tokens == 128  # 0.8 x 160, page-aligned down
    assert r.memory.token_to_kv_pool.swa_layer_ids == [0, 2] and r.memory.token_to_kv_pool.full_layer_ids == [1, 3]
    assert "[full] KV Cache is allocated. #tokens: 160" in caplog.text
    assert "[swa] KV Cache is allocated. #tokens: 128" in caplog.text
    r = ModelRunner(model_dir, max_total_tokens=160, disable_tqdm=True,
                    disable_hybrid_swa_memory=True)
    assert not r.memory.is_hybrid_swa


def test_enable_fp32_lm_head_gives_the_heads_fp32_sums(model_dir):
    """--enable-fp32-lm-head reaches the LM head: its logits are the fp32 sums over the final
    hidden states; without it, the bf16 head's result widened to fp32."""
    from sglang.test.runner_utils import ManualDriver

    prompt = random_prompt(20, seed=5)
    logits, hidden = {}, {}
    for flag in (False, True):
        args = ServerArgs(model_path=model_dir, dtype="bfloat16", max_total_tokens=128, device="cpu",
                          enable_fp32_lm_head=flag, disable_hybrid_swa_memory=True)
        r = ModelRunner(model_dir, args, disable_tqdm=True)
        drv = ManualDriver(r)
        req = drv.new_request(prompt)
        out = drv.extend([req], [list(prompt)], return_full_logits=False)
        drv.free(req)
        head = r.model.lm_head.weight.float()
        logits[flag], hidden[flag] = out.next_token_logits, out.hidden_states.float()
        sums = hidden[flag] @ head.T
        if flag:
            torch.testing.assert_close(logits[flag], sums, atol=1e-4, rtol=1e-4)
        else:
            torch.testing.assert_close(logits[flag], sums.bfloat16().float(), atol=0, rtol=8e-3)
    assert torch.equal(hidden[False], hidden[True])  # the flag changes the head only
    assert not torch.equal(logits[False], logits[True])
