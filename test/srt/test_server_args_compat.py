"""Every accepted flag does what its help says or is reported as having no effect (issue 13).

The walk: each `ServerArgs` field is either read by the server's code (an attribute access, or its
name passed to `getattr`/an option helper, outside the declaration and CLI modules) or listed in
`server_args/compat/no_effect_fields.py` (`NO_EFFECT_FIELDS`); upstream flags without a field are accepted (with their
argument shape) and reported, unknown flags are refused with exit code 2.
"""

import ast
import dataclasses
import pathlib
import subprocess
import sys

import pytest

from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.server_args.compat import NO_EFFECT_FIELDS, NO_EFFECT_WARNING, no_effect_settings
from sglang.srt.server_args.compat import UPSTREAM_ONLY_FLAGS

SRC = pathlib.Path(__file__).resolve().parents[2] / "python" / "sglang"
# Where fields are declared and parsed: a mention there is not a use.
NOT_A_USE = {"srt/server_args/fields.py", "srt/server_args/cli.py", "srt/server_args/compat/__init__.py",
             "srt/server_args/compat/no_effect_fields.py", "srt/server_args/compat/upstream_only_flags.py"}
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "server_args.md"


def _names_used_in_code() -> set:
    used = set()
    for path in SRC.rglob("*.py"):
        if str(path.relative_to(SRC)) in NOT_A_USE or "/test/" in str(path):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.Call):  # getattr(sa, "name", ...) and option helpers like _opt(sa, "name")
                used.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return used


def test_every_field_is_read_or_declared_without_effect():
    used = _names_used_in_code()
    public = [f.name for f in dataclasses.fields(ServerArgs) if not f.name.startswith("_")]
    orphans = [n for n in public if n not in used and n not in NO_EFFECT_FIELDS]
    assert not orphans, f"fields neither read nor listed in NO_EFFECT_FIELDS: {orphans}"
    unknown = sorted(set(NO_EFFECT_FIELDS) - set(public))
    assert not unknown, f"NO_EFFECT_FIELDS names no field: {unknown}"


def test_acting_fields_and_no_effect_fields_live_apart():
    """A field is declared once: in `fields.py` if it acts, in `compat/no_effect_fields.py` if not."""
    from sglang.srt.server_args import fields as acting
    from sglang.srt.server_args.compat.no_effect_fields import NoEffectFields

    groups = [cls for cls in vars(acting).values() if dataclasses.is_dataclass(cls)]
    declared = [f.name for cls in groups for f in dataclasses.fields(cls)]
    assert len(groups) >= 9 and len(declared) == len(set(declared))
    assert not set(declared) & set(NO_EFFECT_FIELDS)
    assert not [f.name for cls in groups for f in dataclasses.fields(cls) if "no_effect" in f.metadata]
    assert all(f.metadata.get("no_effect") for f in dataclasses.fields(NoEffectFields))
    assert set(declared) | set(NO_EFFECT_FIELDS) == {f.name for f in dataclasses.fields(ServerArgs)}


def test_no_effect_list_is_documented():
    text = DOCS.read_text()
    flags = ["--" + name.replace("_", "-") for name in NO_EFFECT_FIELDS]
    flags += [names[0] for names, _kind in UPSTREAM_ONLY_FLAGS.values()]
    for flag in flags:
        assert f"`{flag}`" in text, f"{flag} is missing from docs/server_args.md"


def test_upstream_only_flags_are_accepted_and_reported():
    sa = prepare_server_args(["--model-path", "default", "--cuda-graph-max-bs-decode", "8", "--enable-dp-attention",
                              "--cuda-graph-bs", "1", "2", "4", "--pp-size", "2", "--enable-tf32-matmul"])
    assert sa.ignored_upstream_args == {"cuda_graph_max_bs_decode": "8", "enable_dp_attention": True,
                                        "cuda_graph_bs": ["1", "2", "4"], "enable_tf32_matmul": True}
    assert no_effect_settings(sa) == ["--cuda-graph-bs", "--cuda-graph-max-bs-decode", "--enable-dp-attention",
                                      "--enable-tf32-matmul", "--pp-size"]
    # Defaults are not reported: a plain launch warns about nothing.
    assert no_effect_settings(prepare_server_args(["--model-path", "default"])) == []


def test_engine_kwargs_accept_upstream_only_names():
    sa = ServerArgs.from_kwargs(model_path="default", cuda_graph_max_bs=4)
    assert sa.ignored_upstream_args == {"cuda_graph_max_bs": 4}
    with pytest.raises(TypeError):
        ServerArgs.from_kwargs(model_path="default", not_a_flag_anywhere=1)


def test_yaml_config_may_hold_upstream_only_flags(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cuda-graph-max-bs-decode: 16\nenable_dp_attention: true\nmax_running_requests: 7\n")
    sa = prepare_server_args(["--model-path", "default", "--config", str(cfg)])
    assert sa.max_running_requests == 7
    assert sa.ignored_upstream_args == {"cuda_graph_max_bs_decode": "16", "enable_dp_attention": True}


def test_unknown_flag_exits_2_and_upstream_flag_is_checked(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "sglang.check_server_args", "--model-path", "default",
                          "--surely-not-a-flag", "1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unrecognized arguments: --surely-not-a-flag" in bad.stderr
    ok = subprocess.run([sys.executable, "-m", "sglang.check_server_args", "--model-path", "default",
                         "--cuda-graph-max-bs-decode", "8"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert NO_EFFECT_WARNING in ok.stdout + ok.stderr and "--cuda-graph-max-bs-decode" in ok.stdout + ok.stderr
