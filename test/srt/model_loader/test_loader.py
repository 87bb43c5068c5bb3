"""Loader: sharded and single-file safetensors give the same model, progress bar, dtype rules,
missing weights and unsupported architectures fail with clear messages."""

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader.loader import get_model, resolve_dtype
from sglang.srt.model_loader.weight_utils import list_safetensors_files
from sglang.srt.models.registry import ModelRegistry
from sglang.test.hf_parity import load_hf_model, our_logits, random_prompt
from sglang.test.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("m")), "qwen2", seed=11)


def test_sharded_checkpoint_loads_identically(model_dir, tmp_path, capfd):
    sharded = str(tmp_path / "sharded")
    load_hf_model(model_dir).save_pretrained(sharded, max_shard_size="1MB")  # writes config.json too
    files = list_safetensors_files(sharded)
    assert len(files) > 1 and os.path.exists(os.path.join(sharded, "model.safetensors.index.json"))

    a = get_model(ModelConfig.from_path(model_dir), torch.float32)
    b = get_model(ModelConfig.from_path(sharded), torch.float32)
    err = capfd.readouterr().err
    assert f"Loading safetensors checkpoint shards: 100% Completed | {len(files)}/{len(files)}" in err
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_missing_weight_is_reported(model_dir, tmp_path):
    broken = str(tmp_path / "broken")
    shutil.copytree(model_dir, broken)
    path = os.path.join(broken, "model.safetensors")
    tensors = load_file(path)
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing weights: model\.layers\.1\.self_attn\.qkv_proj\.weight:k"):
        get_model(ModelConfig.from_path(broken), torch.float32, show_progress=False)


def test_no_weights_and_unsupported_architecture(model_dir, tmp_path):
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    shutil.copy(os.path.join(model_dir, "config.json"), empty)
    with pytest.raises(FileNotFoundError, match=r"\*\.safetensors"):
        get_model(ModelConfig.from_path(empty), torch.float32)
    with pytest.raises(ValueError) as e:
        ModelRegistry.resolve_model_cls(["FooForCausalLM"])
    msg = str(e.value)
    assert "Model architectures ['FooForCausalLM'] are not supported for now." in msg
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert arch in msg


def test_resolve_dtype():
    cfg_bf16 = {"torch_dtype": "bfloat16"}
    assert resolve_dtype("auto", cfg_bf16, "cpu") == torch.float32
    assert resolve_dtype(None, None, "cpu") == torch.float32
    assert resolve_dtype("auto", cfg_bf16, "cuda") == torch.bfloat16
    assert resolve_dtype("auto", {"dtype": "float16"}, "cuda") == torch.float16
    assert resolve_dtype("auto", {"dtype": "float32"}, "cuda") == torch.bfloat16
    assert resolve_dtype("half", None, "cpu") == torch.float16
    assert resolve_dtype("float", None, "cpu") == torch.float32
    assert resolve_dtype("bfloat16", None, "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="Unknown dtype"):
        resolve_dtype("int8", None, "cpu")


def test_weights_really_come_from_the_checkpoint(model_dir, tmp_path):
    """Changing one checkpoint tensor changes our logits (nothing is silently re-initialised)."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    changed = str(tmp_path / "changed")
    shutil.copytree(model_dir, changed)
    path = os.path.join(changed, "model.safetensors")
    tensors = load_file(path)
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 2
    save_file(tensors, path, metadata={"format": "pt"})
    prompt = random_prompt(5, seed=0)
    a = our_logits(ModelRunner(model_dir, max_total_tokens=64, disable_tqdm=True), prompt, []).prefill
    b = our_logits(ModelRunner(changed, max_total_tokens=64, disable_tqdm=True), prompt, []).prefill
    torch.testing.assert_close(b, a * 2, atol=1e-4, rtol=1e-4)  # final norm scales the logits linearly
