"""`python -m sglang.launch_pd`: role templates keep decode-only flags off the prefill server, each
role is checked first, and the whole deployment serves and shuts down cleanly."""

import os
import signal
import subprocess
import sys

import psutil
import pytest
import requests

from sglang.srt.disaggregation.launch_pd import parse_args, role_flags
from sglang.test.server_utils import find_free_port, wait_for_health
from sglang.test.tiny_models import make_tiny_model


def test_role_templates_route_flags():
    args, common = parse_args(["--model-path", "m", "--", "--max-total-tokens", "4k", "--num-reserved-decode-tokens", "8",
                               "--disaggregation-decode-polling-interval", "2", "--disaggregation-bootstrap-port", "9000"])
    prefill = role_flags("prefill", common, args)
    decode = role_flags("decode", common, args)
    assert "--num-reserved-decode-tokens" not in prefill and "--disaggregation-decode-polling-interval" not in prefill
    assert "--num-reserved-decode-tokens" in decode and decode[decode.index("--num-reserved-decode-tokens") + 1] == "8"
    assert "--max-total-tokens" in prefill and "--max-total-tokens" in decode
    assert prefill[prefill.index("--disaggregation-mode") + 1] == "prefill"
    assert decode[decode.index("--disaggregation-decode-retraction-backup") + 1] == "host_pool"
    assert "--disaggregation-bootstrap-port" not in " ".join(decode)


def test_check_only_rejects_a_bad_role_before_launch(tmp_path):
    d = make_tiny_model(str(tmp_path / "nemo"), "nemotron_h", seed=0)
    r = subprocess.run([sys.executable, "-m", "sglang.launch_pd", "--model-path", d, "--check-only"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Host-pool retraction does not support Mamba models." in r.stderr
    r = subprocess.run([sys.executable, "-m", "sglang.launch_pd", "--model-path", d, "--check-only",
                        "--decode-retraction-backup", "cpu_tensor"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.server
def test_launch_pd_serves_and_stops(tmp_path):
    d = make_tiny_model(str(tmp_path / "llama"), "llama", seed=8)
    ports = [find_free_port() for _ in range(4)]
    log = open(tmp_path / "pd.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_pd", "--model-path", d, "--port", str(ports[0]),
                             "--prefill-port", str(ports[1]), "--decode-port", str(ports[2]),
                             "--bootstrap-port", str(ports[3]), "--", "--max-total-tokens", "2048"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_for_health(f"http://127.0.0.1:{ports[0]}", timeout=240, process=proc)
        r = requests.post(f"http://127.0.0.1:{ports[0]}/generate", timeout=60,
                          json={"text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 3
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive
