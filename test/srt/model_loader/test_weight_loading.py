"""The shared weight loader (model_loader/weight_loading.py) and the start-up refusals: a fused
checkpoint (Phi-3's qkv_proj / gate_up_proj) loads whole, a missing weight stops the load in one
line naming it, extra tensors give one warning listing them, and a config the server cannot serve
(unknown architecture, unsupported rope_type) stops `launch_server` before anything is spawned,
with one line on stderr."""

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader.loader import ModelConfigError, check_model_servable, get_model
from sglang.test.family_parity import family_dir


def _copy(src, dst, edit_tensors=None, edit_config=None):
    shutil.copytree(src, dst)
    if edit_tensors is not None:
        path = os.path.join(dst, "model.safetensors")
        tensors = load_file(path)
        edit_tensors(tensors)
        save_file(tensors, path, metadata={"format": "pt"})
    if edit_config is not None:
        path = os.path.join(dst, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        edit_config(cfg)
        with open(path, "w") as f:
            json.dump(cfg, f)
    return dst


def _load(path):
    return get_model(ModelConfig.from_path(path), torch.float32, show_progress=False)


def test_fused_checkpoint_loads_whole():
    model = _load(family_dir("phi3"))
    tensors = load_file(os.path.join(family_dir("phi3"), "model.safetensors"))
    assert "model.layers.0.self_attn.qkv_proj.weight" in tensors and "model.layers.0.mlp.gate_up_proj.weight" in tensors
    assert torch.equal(model.model.layers[0].self_attn.qkv_proj.weight, tensors["model.layers.0.self_attn.qkv_proj.weight"])
    assert torch.equal(model.model.layers[0].mlp.gate_up_proj.weight, tensors["model.layers.0.mlp.gate_up_proj.weight"])


def test_missing_fused_weight_is_one_line(tmp_path):
    path = _copy(family_dir("phi3"), str(tmp_path / "m"),
                 edit_tensors=lambda t: t.pop("model.layers.1.mlp.gate_up_proj.weight"))
    with pytest.raises(ValueError) as e:
        _load(path)
    msg = str(e.value)
    assert "\n" not in msg and "model.layers.1.mlp.gate_up_proj.weight:0" in msg


def test_renamed_weights_and_missing_one(tmp_path):
    """Phi's `dense` and `final_layernorm`, Starcoder 2's c_fc/c_proj land where the decoder keeps them."""
    for arch in ("phi", "starcoder2"):
        model = _load(family_dir(arch))
        assert not model.unused_weights, arch
    path = _copy(family_dir("phi"), str(tmp_path / "phi"), edit_tensors=lambda t: t.pop("model.layers.0.self_attn.dense.bias"))
    with pytest.raises(ValueError, match=r"missing weights: model\.layers\.0\.self_attn\.o_proj\.bias"):
        _load(path)


def test_unused_weights_one_warning(tmp_path, caplog):
    def extra(t):
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # known buffer: skipped silently
        t["model.mtp.head.weight"] = torch.ones(2, 2)
        t["model.layers.0.extra_scale"] = torch.ones(3)

    path = _copy(family_dir("mistral"), str(tmp_path / "m"), edit_tensors=extra)
    with caplog.at_level(logging.WARNING, logger="sglang.srt.model_loader.loader"):
        model = _load(path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "model.mtp.head.weight" in warnings[0] and "model.layers.0.extra_scale" in warnings[0]
    assert "inv_freq" not in warnings[0]
    assert sorted(model.unused_weights) == ["model.layers.0.extra_scale", "model.mtp.head.weight"]


def test_unservable_configs(tmp_path):
    unknown = _copy(family_dir("mistral"), str(tmp_path / "unknown"),
                    edit_config=lambda c: c.update(architectures=["FooForCausalLM"]))
    with pytest.raises(ModelConfigError, match=r"^Model architectures \['FooForCausalLM'\] are not supported for now\. "):
        check_model_servable(unknown)
    rope = _copy(family_dir("mistral"), str(tmp_path / "rope"),
                 edit_config=lambda c: c.update(rope_scaling={"rope_type": "mrope", "factor": 2.0}))
    with pytest.raises(ModelConfigError, match=r"^config.json rope_scaling.rope_type='mrope' is not supported"):
        check_model_servable(rope)
    check_model_servable(family_dir("gemma3"))  # per-layer-type rope_parameters
    check_model_servable(family_dir("phi3_longrope"))
    check_model_servable("default")  # no config.json here: the loader resolves it


def test_launch_server_refuses_in_one_line(tmp_path):
    rope = _copy(family_dir("mistral"), str(tmp_path / "rope"),
                 edit_config=lambda c: c.update(rope_scaling={"rope_type": "mrope", "factor": 2.0}))
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", rope, "--port", "1"],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert lines == ["error: config.json rope_scaling.rope_type='mrope' is not supported; "
                     "supported: default, linear, llama3, dynamic, yarn, longrope"]


def test_check_server_args_names_the_field(tmp_path, capsys):
    from sglang.check_server_args import main

    unknown = _copy(family_dir("mistral"), str(tmp_path / "unknown"),
                    edit_config=lambda c: c.update(architectures=["FooForCausalLM"]))
    family_dir("gemma2")
    capsys.readouterr()  # building the tiny checkpoints prints progress bars
    assert main(["--model-path", unknown]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Model architectures ['FooForCausalLM'] are not supported for now.") and "\n" not in err
    assert main(["--model-path", family_dir("gemma2")]) == 0
