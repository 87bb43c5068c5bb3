"""`python -m sglang.check_server_args`: role checks plus model-dependent checks from config.json.

The configs are tiny model folders written here: a Llama, a pure sliding-window Qwen3 (every
layer `sliding_attention`), a hybrid-SWA Qwen3, and a NemotronH-style Mamba2 hybrid.
"""

import json
import os
import subprocess
import sys

import pytest

from sglang.check_server_args import main

MAMBA_MSG = "Host-pool retraction does not support Mamba models."
PURE_SWA_MSG = "Host-pool retraction does not support pure-SWA models."
DECODE = ["--disaggregation-mode", "decode"]
HOST_POOL = ["--disaggregation-decode-retraction-backup", "host_pool"]


def _write(folder, cfg):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import LlamaConfig, Qwen3Config

    root = tmp_path_factory.mktemp("models")
    small = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, vocab_size=128)

    llama = LlamaConfig(num_hidden_layers=2, max_position_embeddings=256, **small).to_dict()
    llama["architectures"] = ["LlamaForCausalLM"]

    def qwen3(layer_types):
        cfg = Qwen3Config(
            num_hidden_layers=len(layer_types),
            head_dim=8,
            use_sliding_window=True,
            sliding_window=64,
            layer_types=layer_types,
            **small,
        ).to_dict()
        cfg["architectures"] = ["Qwen3ForCausalLM"]
        return cfg

    # NemotronH as its checkpoints ship it: the layer kinds in `hybrid_override_pattern`
    # (M = Mamba2, * = attention, - = MLP).
    nemotron_h = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "num_hidden_layers": 4,
        "hybrid_override_pattern": "M*M-",
        "hidden_size": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "vocab_size": 128,
        "mamba_num_heads": 4,
        "mamba_head_dim": 8,
        "ssm_state_size": 16,
        "n_groups": 1,
        "conv_kernel": 4,
        "max_position_embeddings": 256,
    }
    return {
        "llama": _write(root / "llama", llama),
        "pure_swa": _write(root / "pure_swa", qwen3(["sliding_attention", "sliding_attention"])),
        "hybrid_swa": _write(root / "hybrid_swa", qwen3(["sliding_attention", "full_attention"])),
        "mamba": _write(root / "mamba", nemotron_h),
    }


def _run_cli(args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "sglang.check_server_args", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    "model,backup_args,rc,expected",
    [
        ("llama", HOST_POOL, 0, "disaggregation_decode_retraction_backup = 'host_pool'  [input]"),
        ("pure_swa", HOST_POOL, 2, PURE_SWA_MSG),
        ("mamba", HOST_POOL, 2, MAMBA_MSG),
        ("llama", [], 0, "disaggregation_decode_retraction_backup = 'host_pool'  [auto: "),
        ("pure_swa", [], 0, "disaggregation_decode_retraction_backup = 'cpu_tensor'  [auto: host pool ruled out by: model is pure sliding-window]"),
        ("mamba", [], 0, "disaggregation_decode_retraction_backup = 'cpu_tensor'  [auto: host pool ruled out by: model has SSM (Mamba) state]"),
    ],
)
def test_cli_decode_host_pool_matrix(models, model, backup_args, rc, expected):
    proc = _run_cli(["--model-path", models[model], *DECODE, *backup_args])
    assert proc.returncode == rc, proc.stderr
    if rc == 0:
        assert proc.stdout.startswith("OK: role: decode (PD decode)")
        assert expected in proc.stdout
    else:
        assert proc.stderr.strip().splitlines()[-1] == expected
        assert proc.stdout == ""


def test_cli_flag_errors_exit_2(models):
    proc = _run_cli(["--model-path", models["llama"], *HOST_POOL])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "--disaggregation-decode-retraction-backup=host_pool is only supported on a PD decode server."
    )
    proc = _run_cli(["--disaggregation-mode", "decod"])
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_model_summary_and_sources(models, capsys):
    assert main(["--model-path", models["mamba"], "--disaggregation-mode", "prefill", "--page-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "NemotronHForCausalLM; hybrid_ssm=True, pure_swa=False" in out
    assert "page_size = 16  [input]" in out
    assert "load_balance_method = 'follow_bootstrap_room'  [_handle_load_balance_method]" in out
    assert "disaggregation_decode_retraction_backup = 'cpu_tensor'  [auto: not a PD decode server]" in out


def test_cpu_tensor_and_none_pass_for_every_model(models, capsys):
    for name in ("llama", "pure_swa", "hybrid_swa", "mamba"):
        for backup in ("cpu_tensor", "none"):
            assert main(["--model-path", models[name], *DECODE, "--disaggregation-decode-retraction-backup", backup]) == 0
    capsys.readouterr()


def test_hybrid_swa_allows_host_pool(models, capsys):
    assert main(["--model-path", models["hybrid_swa"], *DECODE, *HOST_POOL]) == 0
    assert "pure_swa=False, hybrid_swa=True" in capsys.readouterr().out


def test_decode_radix_with_swa_rejects_hicache(models, capsys):
    args = [*DECODE, "--disaggregation-decode-enable-radix-cache", "--enable-hicache"]
    assert main(["--model-path", models["hybrid_swa"], *args]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "--disaggregation-decode-enable-radix-cache with sliding window attention (SWA) models currently supports "
        "only device-resident cache and is incompatible with --enable-hierarchical-cache."
    )
    assert main(["--model-path", models["llama"], *args]) == 0
    out = capsys.readouterr().out
    assert "'cpu_tensor'  [auto: host pool ruled out by: decode radix cache]" in out


def test_auto_rule_flag_blockers(models, capsys):
    assert main(["--model-path", models["llama"], *DECODE, "--enable-priority-scheduling"]) == 0
    assert "ruled out by: priority scheduling with preemption" in capsys.readouterr().out
    args = ["--model-path", models["llama"], *DECODE, "--enable-priority-scheduling", "--disable-priority-preemption"]
    assert main(args) == 0
    assert "'host_pool'  [auto: " in capsys.readouterr().out
    assert main(["--model-path", models["llama"], *DECODE, "--disaggregation-decode-host-receive-threshold", "0.5"]) == 0
    assert "'host_pool'  [_handle_pd_disaggregation]" in capsys.readouterr().out


def test_default_model_and_non_folder_skip_model_checks(tmp_path, capsys):
    assert main([*DECODE]) == 0
    out = capsys.readouterr().out
    assert "model checks skipped: --model-path default" in out
    assert "'undetermined'" in out
    assert main(["--model-path", str(tmp_path), *DECODE, *HOST_POOL]) == 0
    assert "is not a local folder with a config.json" in capsys.readouterr().out


def test_tp_size_checks_the_family_and_shape(models, capsys):
    """--tp-size: a family TP splits passes; another family, or heads that do not divide, is one line."""
    assert main(["--model-path", models["llama"], "--tp-size", "2"]) == 0
    assert main(["--model-path", models["mamba"], "--tp-size", "2"]) == 2
    assert "NemotronHForCausalLM is not tensor-parallel in this build" in capsys.readouterr().err
    assert main(["--model-path", models["llama"], "--tp-size", "4"]) == 2
    assert "--tp-size 4 does not divide the model's num_attention_heads (2)" in capsys.readouterr().err
