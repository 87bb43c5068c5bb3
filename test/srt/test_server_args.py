"""ServerArgs: flags, aliases, defaults, `--config` YAML, choice errors, provenance, url, PortArgs."""

import argparse
import dataclasses
import subprocess
import sys
import textwrap

import pytest

from sglang.srt.server_args import PortArgs, ServerArgs, prepare_server_args
from sglang.srt.server_args.resolution import gpu_memory_defaults
from sglang.srt.utils import human_readable_int


def _parser():
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


# ---------------------------------------------------------------- defaults
def test_upstream_defaults():
    sa = prepare_server_args([])
    expected = {
        "model_path": "default",
        "host": "127.0.0.1",
        "port": 30000,
        "dtype": "auto",
        "load_format": "auto",
        "kv_cache_dtype": "auto",
        "disaggregation_mode": "null",
        "disaggregation_bootstrap_port": 8998,
        "disaggregation_transfer_backend": "mooncake",
        "disaggregation_decode_retraction_backup": None,
        "disaggregation_decode_polling_interval": 1,
        "disaggregation_decode_host_receive_threshold": 1.0,
        "disaggregation_decode_allocation_policy": "early",
        "schedule_policy": "fcfs",
        "schedule_conservativeness": 1.0,
        "retraction_policy": "length",
        "num_reserved_decode_tokens": 512,
        "max_prefill_tokens": 16384,
        "radix_eviction_policy": "lru",
        "hicache_size": 0,
        "hicache_write_policy": "write_through",
        "hicache_io_backend": "kernel",
        "hicache_mem_layout": "page_first",
        "hicache_storage_backend": None,
        "tp_size": 1,
        "dp_size": 1,
        "dcp_size": 1,
        "stream_interval": 1,
        "log_level": "info",
        "max_running_requests": None,
        "max_total_tokens": None,
        "disable_radix_cache": False,
        "watchdog_timeout": 300,
    }
    assert {k: getattr(sa, k) for k in expected} == expected


def test_parser_defaults_equal_dataclass_defaults():
    args = _parser().parse_args([])
    for f in dataclasses.fields(ServerArgs):
        if hasattr(args, f.name):
            assert getattr(args, f.name) == f.default, f.name


def test_machine_dependent_defaults_on_this_host():
    import torch

    sa = ServerArgs()
    on_gpu = torch.cuda.is_available()
    assert sa.device == ("cuda" if on_gpu else "cpu")
    assert sa.resolution_source("device") == "_handle_missing_default_values"
    if not on_gpu:
        assert (sa.attention_backend, sa.sampling_backend) == ("torch_native", "pytorch")
        assert sa.resolution_source("attention_backend") == "_handle_cpu_backends"
        assert (sa.chunked_prefill_size, sa.mem_fraction_static) == (4096, 0.8)
    assert sa.page_size == 1 and sa.resolution_source("page_size") == "_page_size_default"
    assert (sa.tokenizer_path, sa.served_model_name) == ("default", "default")
    assert 0 <= sa.random_seed <= 1 << 30


def test_explicit_values_are_kept():
    sa = ServerArgs(
        model_path="/m",
        tokenizer_path="/t",
        served_model_name="srv",
        device="cpu",
        attention_backend="triton",
        sampling_backend="pytorch",
        page_size=16,
        chunked_prefill_size=-1,
        mem_fraction_static=0.5,
        random_seed=7,
    )
    for name in ("tokenizer_path", "served_model_name", "device", "attention_backend", "page_size", "random_seed"):
        assert sa.resolution_source(name) is None, name
    assert (sa.page_size, sa.chunked_prefill_size, sa.mem_fraction_static, sa.random_seed) == (16, -1, 0.5, 7)
    assert sa.attention_backends() == ("triton", "triton")
    sa = ServerArgs(device="cpu", prefill_attention_backend="triton")
    assert sa.attention_backends() == ("triton", "torch_native")


def test_cuda_device_picks_triton_without_touching_cpu_rules():
    sa = ServerArgs(device="cuda", chunked_prefill_size=2048, mem_fraction_static=0.7)
    assert sa.attention_backend == "triton"
    assert sa.resolution_source("attention_backend") == "_handle_attention_backend_compatibility"
    assert sa.sampling_backend == "pytorch"
    assert sa.resolution_source("sampling_backend") == "_sampling_backend_default"


@pytest.mark.parametrize(
    "gpu_gib,decode,expected",
    [
        (16, False, (2048, 0.773)),  # reserved 512 + 2048*1.5 + 128 MB
        (24, False, (4096, 0.724)),  # reserved 512 + 4096*1.5 + 128
        (80, False, (8192, 0.842)),  # reserved 512 + 8192*1.5 + 128
        (80, True, (8192, 0.875)),  # decode: 2048 activation tokens -> floor of 10 GiB applies
        (256, False, (16384, 0.904)),  # reserved 512 + 16384*1.5 + 128
        (None, False, (4096, 0.95)),
    ],
)
def test_gpu_memory_rule(gpu_gib, decode, expected):
    mb = None if gpu_gib is None else gpu_gib * 1024
    got = gpu_memory_defaults(mb, chunked_prefill_size=None, max_running_requests=None, is_decode=decode)
    assert got == expected


def test_role_dependent_defaults():
    prefill = ServerArgs(disaggregation_mode="prefill")
    assert prefill.load_balance_method == "follow_bootstrap_room"
    assert prefill.resolution_source("load_balance_method") == "_handle_load_balance_method"
    assert prefill.disable_radix_cache is False
    assert ServerArgs().load_balance_method == "round_robin"
    assert ServerArgs(load_balance_method="total_tokens", disaggregation_mode="prefill").load_balance_method == "total_tokens"

    decode = ServerArgs(disaggregation_mode="decode")
    assert decode.disable_radix_cache is True
    assert decode.hicache_ratio is None  # resolved by the scheduler from the pool (reference 4.5)
    assert decode.disaggregation_decode_extra_slots == 0
    assert ServerArgs(disaggregation_mode="decode", max_running_requests=16).disaggregation_decode_extra_slots == 32
    assert ServerArgs(disaggregation_mode="decode", max_running_requests=64).disaggregation_decode_extra_slots == 0
    assert ServerArgs(enable_hierarchical_cache=True).hicache_ratio == 2.0
    assert ServerArgs(enable_hierarchical_cache=True, hicache_host_memory_mode="buffer_only").hicache_ratio == 1.2
    assert ServerArgs(enable_hierarchical_cache=True, hicache_ratio=3.0).hicache_ratio == 3.0


def test_decode_radix_warnings(caplog):
    with caplog.at_level("WARNING"):
        ServerArgs(disaggregation_mode="decode")
        ServerArgs(disaggregation_mode="decode", disaggregation_decode_enable_radix_cache=True)
    text = caplog.text
    assert "Radix cache is disabled for decode server" in text
    assert "EXPERIMENTAL: Radix cache is enabled for decode server" in text


# ---------------------------------------------------------------- flags and aliases
@pytest.mark.parametrize(
    "argv,field,value",
    [
        (["--model", "/x"], "model_path", "/x"),
        (["--model-path", "/x"], "model_path", "/x"),
        (["--enable-hicache"], "enable_hierarchical_cache", True),
        (["--enable-hierarchical-cache"], "enable_hierarchical_cache", True),
        (["--dcp-size", "2"], "dcp_size", 2),
        (["--decode-context-parallel-size", "2"], "dcp_size", 2),
        (["--tp", "2"], "tp_size", 2),
        (["--tensor-parallel-size", "2"], "tp_size", 2),
        (["--dp-size", "2"], "dp_size", 2),
        (["--data-parallel-size", "2"], "dp_size", 2),
        (["--ep", "4"], "ep_size", 4),
        (["--nccl-init-addr", "10.0.0.1:5000"], "dist_init_addr", "10.0.0.1:5000"),
        (["--max-total-tokens", "4k"], "max_total_tokens", 4000),
        (["--max-total-tokens", "4K"], "max_total_tokens", 4096),
        (["--context-length", "32K"], "context_length", 32768),
        (["--mem-fraction-static", "0.5"], "mem_fraction_static", 0.5),
        (["--disaggregation-decode-retraction-backup", "none"], "disaggregation_decode_retraction_backup", "none"),
        (["--radix-eviction-policy-config", '{"threshold": 3}'], "radix_eviction_policy_config", {"threshold": 3}),
        (["--log-requests-level", "3"], "log_requests_level", 3),
    ],
)
def test_flags_and_aliases(argv, field, value):
    assert getattr(_parser().parse_args(argv), field) == value


def test_every_issue_flag_exists():
    flags = {s for a in _parser()._actions for s in a.option_strings}
    wanted = """--model-path --model --tokenizer-path --dtype --context-length --trust-remote-code --load-format
    --served-model-name --skip-tokenizer-init --host --port --api-key --log-level --enable-metrics --stream-interval
    --skip-server-warmup --mem-fraction-static --max-running-requests --max-total-tokens --chunked-prefill-size
    --max-prefill-tokens --page-size --schedule-policy --schedule-conservativeness --retraction-policy
    --enable-priority-scheduling --disable-priority-preemption --schedule-low-priority-values-first
    --disable-radix-cache --radix-eviction-policy --swa-full-tokens-ratio --num-reserved-decode-tokens
    --enable-hierarchical-cache --enable-hicache --hicache-ratio --hicache-size --hicache-write-policy
    --hicache-io-backend --hicache-mem-layout --hicache-storage-backend --disaggregation-mode
    --disaggregation-transfer-backend --disaggregation-bootstrap-port --disaggregation-ib-device
    --disaggregation-decode-retraction-backup --disaggregation-decode-enable-offload-kvcache
    --disaggregation-decode-enable-radix-cache --disaggregation-decode-polling-interval --tp-size --dp-size
    --dcp-size --decode-context-parallel-size --device --random-seed --attention-backend
    --prefill-attention-backend --decode-attention-backend --sampling-backend --config --enable-mixed-chunk
    --watchdog-timeout --mamba-ssm-dtype --max-mamba-cache-size --mamba-full-memory-ratio
    --disaggregation-decode-host-receive-threshold --disaggregation-decode-allocation-policy --enable-cache-report
    --show-time-cost --tokenizer-mode --revision --file-storage-path --kv-cache-dtype --is-embedding
    --json-model-override-args --sleep-on-idle --hicache-host-memory-fraction --log-requests --tokenizer-worker-num
    --nnodes --node-rank --dist-init-addr --base-gpu-id --pp-size --ep-size --attn-dp-size --load-balance-method
    --enable-streaming-session --enable-session-radix-cache --radix-cache-backend --enable-lmcache""".split()
    assert sorted(set(wanted) - flags) == []


def test_transfer_backend_and_backup_choices():
    choices = {a.dest: a.choices for a in _parser()._actions}
    assert set(choices["disaggregation_transfer_backend"]) >= {"mooncake", "mooncake_tcp", "fake", "nixl", "mori", "ascend"}
    assert choices["disaggregation_decode_retraction_backup"] == ["cpu_tensor", "host_pool", "none"]
    assert choices["disaggregation_mode"] == ["null", "prefill", "decode"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--disaggregation-mode", "decod"],
        ["--disaggregation-decode-retraction-backup", "hostpool"],
        ["--disaggregation-transfer-backend", "rdma"],
        ["--attention-backend", "flash"],
        ["--schedule-policy", "sjf"],
    ],
)
def test_choice_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        prepare_server_args(argv)
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_unknown_flag_and_bad_int(capsys):
    with pytest.raises(SystemExit):
        prepare_server_args(["--no-such-flag"])
    assert "unrecognized arguments" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prepare_server_args(["--max-total-tokens", "1.5K"])
    assert "Decimals are not allowed with binary suffixes" in capsys.readouterr().err


def test_human_readable_int():
    assert [human_readable_int(v) for v in ("100", "2k", "1.5k", "2K", "1M", "3g")] == [100, 2000, 1500, 2048, 1 << 20, 3 * 10**9]
    with pytest.raises(argparse.ArgumentTypeError):
        human_readable_int("abc")


def test_radix_eviction_policy_explicitly_set():
    assert prepare_server_args([])._radix_eviction_policy_explicitly_set is False
    assert prepare_server_args(["--radix-eviction-policy", "lfu"])._radix_eviction_policy_explicitly_set is True


# ---------------------------------------------------------------- --config YAML
def test_yaml_config_merge_and_cli_override(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        textwrap.dedent(
            """
            model-path: /models/x
            page_size: 16
            disable-radix-cache: true
            enable_metrics: false
            tp_size: 2
            hicache_storage_backend: null
            radix_eviction_policy_config: {threshold: 9, next_prompt_estimate: 1}
            """
        )
    )
    sa = prepare_server_args(["--config", str(cfg), "--page-size", "32"])
    assert (sa.model_path, sa.page_size, sa.disable_radix_cache, sa.enable_metrics, sa.tp_size) == ("/models/x", 32, True, False, 2)
    assert sa.radix_eviction_policy_config == {"threshold": 9, "next_prompt_estimate": 1}
    assert sa.resolution_source("page_size") is None
    sa = prepare_server_args([f"--config={cfg}"])
    assert sa.page_size == 16


def test_yaml_config_unknown_key(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("not_a_flag: 1\n")
    with pytest.raises(SystemExit):
        prepare_server_args(["--config", str(cfg)])
    assert "not_a_flag" in capsys.readouterr().err


def test_yaml_config_values_are_validated(tmp_path):
    cfg = tmp_path / "decode.yaml"
    cfg.write_text("disaggregation-mode: prefill\ndisaggregation-decode-retraction-backup: host_pool\n")
    with pytest.raises(ValueError, match="only supported on a PD decode server"):
        prepare_server_args(["--config", str(cfg)])
    assert prepare_server_args(["--config", str(cfg), "--disaggregation-mode", "decode"]).disaggregation_mode == "decode"


# ---------------------------------------------------------------- provenance
SHAPES = [
    {},
    {"disaggregation_mode": "decode"},
    {"disaggregation_mode": "prefill", "disaggregation_transfer_backend": "mooncake_tcp"},
    {"disaggregation_mode": "decode", "disaggregation_decode_host_receive_threshold": 0.5},
    {"enable_hierarchical_cache": True, "hicache_io_backend": "direct"},
]


@pytest.mark.parametrize("kw", SHAPES)
def test_every_change_is_explained_and_input_intact(kw, monkeypatch):
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    sa = ServerArgs(**kw)
    raw = sa.raw_input()
    for f in dataclasses.fields(ServerArgs):
        assert raw[f.name] == kw.get(f.name, f.default), f.name
        if getattr(sa, f.name) != raw[f.name]:
            source = sa.resolution_source(f.name)
            assert source is not None, f.name
            last = [d[f.name] for s, d in sa.declarations() if f.name in d][-1]
            assert last == getattr(sa, f.name)
    assert set(sa.resolved_dict()) >= {f.name for f in dataclasses.fields(ServerArgs) if not f.name.startswith("_")}


def test_decode_provenance_and_explain():
    sa = ServerArgs(disaggregation_mode="decode")
    assert sa.raw_input()["disable_radix_cache"] is False
    assert sa.disable_radix_cache is True
    assert sa.resolution_source("disable_radix_cache") == "_handle_pd_disaggregation"
    assert ("_handle_pd_disaggregation", {"disable_radix_cache": True}) in sa.declarations()
    assert sa.resolved_dict()["disable_radix_cache"] is True
    assert sa.resolved_dict()["enable_dp_attention"] is False
    assert "disable_radix_cache = True  [_handle_pd_disaggregation; input False]" in sa.explain()
    assert "disaggregation_mode = 'decode'  [input]" in sa.explain()
    assert sa.resolution_source("port") is None


def test_declaration_guards():
    sa = ServerArgs()
    with pytest.raises(AttributeError, match=r"src: \['nope'\] are not ServerArgs fields"):
        sa.override("src", nope=1)
    with pytest.raises(ValueError, match="declared after resolution"):
        sa._declare("late", page_size=2)
    with pytest.raises(AttributeError):
        sa._view().page_size = 3
    sa.override("kv_cache_builder.decode_retraction", disaggregation_decode_retraction_backup="cpu_tensor")
    assert sa.disaggregation_decode_retraction_backup == "cpu_tensor"
    assert sa.resolution_source("disaggregation_decode_retraction_backup") == "kv_cache_builder.decode_retraction"


def test_assignment_during_resolution_is_refused(monkeypatch):
    import sglang.srt.server_args.resolution as res

    def bad_rule(sa):
        sa.page_size = 4

    monkeypatch.setattr(res, "RESOLUTION_PIPELINE", (bad_rule,))
    with pytest.raises(AttributeError, match="assigned during resolution"):
        ServerArgs()


def test_pickle_round_trip():
    import pickle

    sa = ServerArgs(disaggregation_mode="decode")
    back = pickle.loads(pickle.dumps(sa))
    assert back == sa
    assert back.raw_input() == sa.raw_input() and back.declarations() == sa.declarations()


# ---------------------------------------------------------------- url, PortArgs, import cost
@pytest.mark.parametrize(
    "host,url",
    [("127.0.0.1", "http://127.0.0.1:8000"), ("0.0.0.0", "http://127.0.0.1:8000"), ("", "http://127.0.0.1:8000"), ("::", "http://[::1]:8000"), ("10.1.2.3", "http://10.1.2.3:8000")],
)
def test_url(host, url):
    assert ServerArgs(host=host, port=8000).url() == url


def test_port_args_ipc():
    p = PortArgs.init_new(ServerArgs())
    names = [p.tokenizer_ipc_name, p.scheduler_input_ipc_name, p.detokenizer_ipc_name, p.rpc_ipc_name, p.metrics_ipc_name]
    assert all(n.startswith("ipc://") for n in names) and len(set(names)) == len(names)
    assert isinstance(p.nccl_port, int) and p.tokenizer_worker_ipc_name is None
    assert PortArgs.init_new(ServerArgs(tokenizer_worker_num=2)).tokenizer_worker_ipc_name.startswith("ipc://")
    assert PortArgs.init_new(ServerArgs(nccl_port=12345)).nccl_port == 12345


def test_port_args_stay_ipc_in_a_private_directory_with_attention_dp():
    """Upstream switches to TCP with attention-DP; here `--attn-dp-size` has no effect, so it must
    not open network ports (issue 51): every channel stays ipc in the server's 0700 directory.
    A malformed `--dist-init-addr` still gets upstream's error."""
    import os

    for p in (PortArgs.init_new(ServerArgs(attn_dp_size=2, port=30000)),
              PortArgs.init_new(ServerArgs(attn_dp_size=2), dp_rank=1),
              PortArgs.init_new(ServerArgs(attn_dp_size=2, dist_init_addr="10.0.0.5:5000"), dp_rank=0, worker_ports=[7000])):
        names = [p.tokenizer_ipc_name, p.scheduler_input_ipc_name, p.detokenizer_ipc_name, p.rpc_ipc_name,
                 p.metrics_ipc_name, p.load_collector_ipc_name]
        assert all(n.startswith(f"ipc://{p.ipc_dir}/") for n in names) and len(set(names)) == len(names)
        assert os.stat(p.ipc_dir).st_mode & 0o777 == 0o700
    with pytest.raises(ValueError, match="Missing port"):
        PortArgs.init_new(ServerArgs(attn_dp_size=2, dist_init_addr="192.168.1.1"))
    with pytest.raises(ValueError):
        PortArgs.init_new(ServerArgs(attn_dp_size=2, dist_init_addr=":abc"))


def test_import_does_not_load_torch():
    code = "import sys, sglang.srt.server_args; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
