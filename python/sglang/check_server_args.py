"""`python -m sglang.check_server_args <server flags>`: validate a flag set before launch.

Why: a PD deployment starts several servers with different roles; a wrong flag combination
should fail in the deploy script, in a second, not after weights are loaded. This builds the
`ServerArgs` exactly as `sglang serve` would (same parser, `--config` merge, same validation
messages), then, when `--model-path` is a local folder with a `config.json`, reads only that file
to run the model-dependent checks the server runs when it builds its caches (host-pool retraction
with a Mamba hybrid or a pure sliding-window model). No weights, no torch model.

Exit status: 0 with a short summary on stdout; 2 with the upstream message on stderr (argparse
usage errors also exit 2).
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from sglang.srt.server_args.compat import NO_EFFECT_WARNING, no_effect_settings
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.server_args.resolution import infer_decode_retraction_backup

SUMMARY_FIELDS = (
    "device",
    "attention_backend",
    "sampling_backend",
    "page_size",
    "chunked_prefill_size",
    "mem_fraction_static",
    "max_total_tokens",
    "max_running_requests",
    "disable_radix_cache",
    "enable_hierarchical_cache",
    "hicache_ratio",
    "load_balance_method",
    "disaggregation_transfer_backend",
    "disaggregation_bootstrap_port",
)

_ROLES = {"null": "colocated (no PD disaggregation)", "prefill": "PD prefill", "decode": "PD decode"}


def _source_of(sa: ServerArgs, name: str) -> str:
    source = sa.resolution_source(name)
    if source is not None:
        return source
    default = ServerArgs.__dataclass_fields__[name].default
    return "input" if sa.raw_input()[name] != default else "default"


def _load_model_config(model_path: str):
    """Returns (ModelConfig or None, note)."""
    if model_path == "default":
        return None, "model checks skipped: --model-path default (the packaged model) is resolved by the model loader"
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        return None, f"model checks skipped: {model_path!r} is not a local folder with a config.json"
    from sglang.srt.configs.model_config import ModelConfig

    return ModelConfig.from_path(model_path), None


def _model_checks(sa: ServerArgs, model_config, backup: Optional[str]) -> None:
    from sglang.srt.mem_cache.registry import validate_host_pool_retraction
    from sglang.srt.model_loader.loader import check_model_servable, check_tp_servable

    check_model_servable(sa.model_path)
    check_tp_servable(sa.model_path, sa.tp_size)  # --tp-size: a family and a shape TP splits

    validate_host_pool_retraction(backup, model_config.is_hybrid_ssm, model_config.is_pure_swa,
                                  sa.enable_mamba_host_pool_backup)
    if (
        sa.disaggregation_mode == "decode"
        and sa.disaggregation_decode_enable_radix_cache
        and model_config.is_hybrid_swa
        and sa.enable_hierarchical_cache
    ):
        raise ValueError(
            "--disaggregation-decode-enable-radix-cache with sliding window attention (SWA) models currently "
            "supports only device-resident cache and is incompatible with --enable-hierarchical-cache."
        )


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        sa = prepare_server_args(argv, prog="python -m sglang.check_server_args")
        model_config, note = _load_model_config(sa.model_path)
        backup, reason = infer_decode_retraction_backup(
            sa,
            is_hybrid_ssm=model_config.is_hybrid_ssm if model_config else None,
            is_pure_swa=model_config.is_pure_swa if model_config else None,
        )
        if model_config is not None:
            _model_checks(sa, model_config, backup)
    except (ValueError, NotImplementedError, AssertionError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 2

    out = [f"OK: role: {sa.disaggregation_mode} ({_ROLES[sa.disaggregation_mode]})"]
    if model_config is not None:
        out.append(
            f"model: {sa.model_path} ({model_config.architecture}; hybrid_ssm={model_config.is_hybrid_ssm}, "
            f"pure_swa={model_config.is_pure_swa}, hybrid_swa={model_config.is_hybrid_swa})"
        )
    else:
        out.append(f"model: {sa.model_path} ({note})")
    for name in SUMMARY_FIELDS:
        out.append(f"  {name} = {getattr(sa, name)!r}  [{_source_of(sa, name)}]")
    backup_source = _source_of(sa, "disaggregation_decode_retraction_backup")
    if sa.disaggregation_decode_retraction_backup is None:
        backup_source = f"auto: {reason}"
    shown = backup if backup is not None else "undetermined"
    out.append(f"  disaggregation_decode_retraction_backup = {shown!r}  [{backup_source}]")
    ignored = no_effect_settings(sa)
    if ignored:
        out.append(f"warning: {NO_EFFECT_WARNING}: {', '.join(ignored)}")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
