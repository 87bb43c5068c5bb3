"""`python -m sglang.launch_pd`: role templates keep decode-only flags off the prefill server, each
role is checked first, and the whole deployment serves and shuts down cleanly."""

import os
import signal
import subprocess
import sys
import time
import warnings

import psutil
import pytest
import requests
import torch

from sglang.srt.disaggregation.mooncake import same_host
from sglang.srt.disaggregation.launch_pd import busy_ports, parse_args, role_flags, router_cmd
from sglang.srt.layers import cpu_ops, logits_processor
from sglang.srt.utils.cpu_binding import available_cores, format_cores
from sglang.test.fuzz.cases import FuzzTarget
from sglang.test.fuzz.runner import assert_pools_restored, run_fuzz
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
    assert prefill.count("--enable-metrics") == 1 == decode.count("--enable-metrics")  # on by default
    args, common = parse_args(["--model-path", "m", "--", "--enable-metrics"])
    assert role_flags("decode", common, args).count("--enable-metrics") == 1
    # the prefill computes while the decode reserves its slots, unless the flags say otherwise
    assert prefill[prefill.index("--optimistic-prefill-attempts") + 1] == "1"
    assert "--optimistic-prefill-attempts" not in decode
    args, common = parse_args(["--model-path", "m", "--", "--optimistic-prefill-attempts", "0"])
    prefill = role_flags("prefill", common, args)
    assert prefill.count("--optimistic-prefill-attempts") == 1
    assert prefill[prefill.index("--optimistic-prefill-attempts") + 1] == "0"


def test_the_router_logs_at_warn_unless_asked():
    """At INFO the router logs every health check of both members; launch_pd starts it at warn."""
    pytest.importorskip("sglang_router")
    args, _ = parse_args(["--model-path", "m"])
    cmd = router_cmd(args)
    assert cmd[cmd.index("--log-level") + 1] == "warn"
    args, _ = parse_args(["--model-path", "m", "--router-log-level", "info"])
    cmd = router_cmd(args)
    assert cmd[cmd.index("--log-level") + 1] == "info"


def test_check_only_rejects_a_bad_role_before_launch(tmp_path):
    d = make_tiny_model(str(tmp_path / "nemo"), "nemotron_h", seed=0)
    r = subprocess.run([sys.executable, "-m", "sglang.launch_pd", "--model-path", d, "--check-only"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Host-pool retraction does not support Mamba models." in r.stderr
    r = subprocess.run([sys.executable, "-m", "sglang.launch_pd", "--model-path", d, "--check-only",
                        "--decode-retraction-backup", "cpu_tensor"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def _clients_shapes_then_pools_free(router, ports):
    """What real clients send, through launch_pd's router: the openai client with n>1, a prompt
    batch x n, a stream cut mid-way, an invalid value; then the seeded fuzzer's mix. Afterwards
    both servers are healthy and every pool is back to its free size."""
    import openai

    client = openai.OpenAI(base_url=router + "/v1", api_key="x", max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], n=2,
                                          max_tokens=6, temperature=0)
    assert len(chat.choices) == 2 and chat.choices[0].message.content == chat.choices[1].message.content
    batch = client.completions.create(model="m", prompt=["Hello", "Once upon a time"], n=2, max_tokens=5,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" and c.text for c in batch.choices)
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Count to ten"}],
                                            max_tokens=64, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()  # the client hangs up mid-stream
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt="Hello", max_tokens=4, temperature=-1)
    servers = [f"http://127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[2]}"]
    _routes_beyond_chat(client, router, servers[1])
    info = requests.get(servers[1] + "/server_info", timeout=30).json()
    target = FuzzTarget(url=router, vocab_size=info["vocab_size"], context_len=info["context_len"],
                        behind_sglang_router=True, tokenize_routes=False, abort_urls=[servers[1]], pd=True)
    report = run_fuzz(target, num_cases=48, concurrency=16, seed=1304)
    assert not report.violations, report.summary()
    for u in servers + [router]:
        assert requests.get(u + "/health", timeout=10).status_code == 200
    assert_pools_restored(servers)
    _metrics_moved(servers)


def _routes_beyond_chat(client, router, decode_url):
    """The Responses API, embeddings, rerank and score in a PD deployment (docs/server.md): the
    real router answers 501 for /v1/responses and /v1/embeddings and has no /v1/score; the decode
    server serves /v1/responses by running each turn through the router (same text as the chat
    completion, streamed events, a stored conversation); rerank reaches both PD servers, which say
    how to serve embedding models."""
    import openai

    assert requests.post(router + "/v1/responses", json={"input": "hi"}, timeout=30).status_code == 501
    assert requests.post(router + "/v1/embeddings", json={"model": "m", "input": "hi"}, timeout=30).status_code == 501
    assert requests.post(router + "/v1/score", json={"query": "a", "items": ["b"], "label_token_ids": [1]},
                         timeout=30).status_code == 404
    rerank = requests.post(router + "/v1/rerank", json={"query": "q", "documents": ["d"]}, timeout=30)
    assert rerank.status_code == 400 and "--is-embedding" in rerank.text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    chat = client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0)
    decode = openai.OpenAI(base_url=decode_url + "/v1", api_key="x", max_retries=0, timeout=120)
    first = decode.responses.create(model="m", input="Hi", instructions="Be brief.", max_output_tokens=6,
                                    temperature=0)
    assert first.status == "completed" and first.output_text == chat.choices[0].message.content
    assert first.usage.input_tokens == chat.usage.prompt_tokens
    events = list(decode.responses.create(model="m", input="Hi", instructions="Be brief.", max_output_tokens=6,
                                          temperature=0, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.output_text == first.output_text
    second = decode.responses.create(model="m", input="More?", previous_response_id=first.id, max_output_tokens=4,
                                     temperature=0)
    assert second.status == "completed" and second.usage.input_tokens > first.usage.input_tokens
    decode.close()


def _metrics_moved(servers):
    """launch_pd turns --enable-metrics on: both roles count what they served, their queues are
    empty again, the prefill counted its KV transfers (upstream's names, prometheus' parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    values = []
    for u in servers:
        r = requests.get(u + "/metrics", timeout=30)
        assert r.status_code == 200
        out = {}
        for fam in text_string_to_metric_families(r.text):
            for smp in fam.samples:
                out[smp.name] = out.get(smp.name, 0.0) + smp.value
        values.append(out)
    prefill, decode = values
    for m in values:
        assert m["sglang:num_requests_total"] > 0 and m["sglang:num_running_reqs"] == 0
    assert prefill["sglang:num_kv_transfers_total"] > 0 and prefill["sglang:kv_transfer_bytes_total"] > 0
    assert prefill["sglang:kv_transfer_latency_ms"] > 0 and prefill["sglang:kv_transfer_speed_gb_s"] > 0
    assert prefill["sglang:num_prefill_bootstrap_queue_reqs"] == 0 == prefill["sglang:num_prefill_inflight_queue_reqs"]
    assert decode["sglang:num_decode_prealloc_queue_reqs"] == 0 == decode["sglang:num_decode_transfer_queue_reqs"]
    assert decode["sglang:generation_tokens_total"] > 0 and decode["sglang:num_retracted_reqs"] == 0
    assert "sglang:num_kv_transfer_failures_total" in decode


def _web_page_chats_through_the_router(decode_url):
    """As docs/pd.md says: the decode server's page (headless Chromium) sends its chat through the
    router (a decode server alone cannot serve it) and shows the decode server's state."""
    from sglang.test.browser import chromium_missing_reason, headless_chromium

    reason = chromium_missing_reason()
    if reason:  # not a skip: the rest of the launch_pd test still has to run
        warnings.warn(f"launch_pd web page not checked in a browser: {reason}")
        return
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = headless_chromium()
    try:
        driver.get(decode_url + "/")
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#model option"))
        driver.find_element(By.ID, "prompt").send_keys("Hello there")
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: "tok/s" in d.find_element(By.ID, "speed").text)
        assert driver.find_element(By.CSS_SELECTOR, ".msg.assistant .body").text.strip()
        assert driver.find_element(By.ID, "mode").text == "decode"
        assert not driver.find_element(By.ID, "error").is_displayed()
    finally:
        driver.quit()


def _member_pid(root_pid, role):
    for p in psutil.Process(root_pid).children(recursive=False):
        if f"--disaggregation-mode {role}" in " ".join(p.cmdline()):
            return p
    raise AssertionError(f"no {role} server under launch_pd")


def _serves(url, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            r = requests.post(url + "/generate", timeout=30, json={
                "text": "Hello", "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}})
            if r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 3:
                return True
        except requests.RequestException:
            pass
        time.sleep(1)
    return False


def _start_launch_pd(tmp_path, **popen_kw):
    """launch_pd on a tiny model and free ports; returns (process, [router, prefill, decode,
    bootstrap] ports, log path)."""
    d = make_tiny_model(str(tmp_path / "llama"), "llama", seed=9)
    ports = [find_free_port() for _ in range(4)]
    log_path = tmp_path / "pd.log"
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_pd", "--model-path", d, "--port", str(ports[0]),
                             "--prefill-port", str(ports[1]), "--decode-port", str(ports[2]),
                             "--bootstrap-port", str(ports[3]), "--", "--max-total-tokens", "2048"],
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, **popen_kw)
    return proc, ports, log_path


@pytest.mark.server
def test_launch_pd_serves_restarts_a_dead_member_and_stops(tmp_path):
    """As documented (docs/pd.md): the deployment serves; a member that dies is restarted and the
    deployment serves again; SIGTERM stops every member before launch_pd exits (code 0). Giving
    up past --max-restarts: test_pd_supervisor.py."""
    proc, ports, log_path = _start_launch_pd(tmp_path)
    router = f"http://127.0.0.1:{ports[0]}"
    try:
        wait_for_health(router, timeout=240, process=proc)
        assert _serves(router, 30)
        assert len(psutil.Process(proc.pid).children(recursive=True)) >= 3
        # both schedulers are bound to every core and take turns on one file (docs/pd.md)
        cores = available_cores()
        for role in ("prefill", "decode"):
            affinities = [sorted(c.cpu_affinity()) for c in _member_pid(proc.pid, role).children(recursive=True)]
            assert cores in affinities, (role, affinities)
        log = log_path.read_text(errors="replace")
        assert log.count(f"bound to cores {format_cores(cores)}") == 2
        turn_files = {line.split(" on ", 1)[1].split()[0] for line in log.splitlines() if "compute turns: shared" in line}
        assert len(turn_files) == 1 and log.count("compute turns: shared") == 2, log
        _clients_shapes_then_pools_free(router, ports)
        _web_page_chats_through_the_router(f"http://127.0.0.1:{ports[2]}")
        # one machine: the KV went by the same-host copy (where the kernel lets siblings copy), proven
        # once for the decode process
        copies = same_host.copy_permitted()
        assert log_path.read_text(errors="replace").count(same_host.COPY_MESSAGE) == (1 if copies else 0)
        # the decode server's all-greedy batches took their token ids from the LM head's pass
        if cpu_ops.linear_panels_enabled(torch.float32):
            assert logits_processor.ARGMAX_MESSAGE in log_path.read_text(errors="replace")
        # The router runs at warn: its health checks (every 5 s) and requests leave no INFO lines.
        router_info = [ln for ln in log_path.read_text(errors="replace").splitlines() if "smg::" in ln and "INFO" in ln]
        assert not router_info, router_info[:3]
        _member_pid(proc.pid, "decode").kill()
        assert _serves(router, 120), "the deployment did not serve again after the decode restart"
        log = log_path.read_text(errors="replace")
        assert "the decode server exited with code -9; restarting it" in log
        assert "the decode server is back" in log
        assert log.count(same_host.COPY_MESSAGE) == (2 if copies else 0)  # the restarted decode proved itself again
        tree = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
        _, alive = psutil.wait_procs(tree, timeout=1)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert not os.path.exists(os.path.dirname(turn_files.pop()))  # launch_pd's own directory is gone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ignore_sigint():  # what a shell does to a script's background job (no job control)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.server
def test_sigint_stops_launch_pd_started_as_a_background_job(tmp_path):
    """`launch_pd ... &` in a script inherits SIGINT ignored; `kill -INT` must still stop the whole
    deployment (as it stops launch_server), here while the members are still starting."""
    proc, _, log_path = _start_launch_pd(tmp_path, preexec_fn=_ignore_sigint)
    try:
        deadline = time.time() + 120
        while len(psutil.Process(proc.pid).children()) < 2 and time.time() < deadline:
            time.sleep(0.5)
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 2, log_path.read_text(errors="replace")
        time.sleep(2)  # past the instant a member's process exists before launch_pd holds its handle
        tree = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0, log_path.read_text(errors="replace")
        _, alive = psutil.wait_procs(tree, timeout=5)
        assert not [p for p in alive if _running(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_launch_pd_refuses_one_port_for_two_members():
    """Two members on one port would fail only after loading weights (one of them cannot bind):
    argparse refuses it at once, naming both flags."""
    with pytest.raises(SystemExit) as e:
        parse_args(["--port", "30100"])  # the prefill's default port
    assert e.value.code == 2
    r = subprocess.run([sys.executable, "-m", "sglang.launch_pd", "--decode-port", "8998", "--check-only"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "--decode-port and --bootstrap-port are both 8998: the router, prefill, decode and bootstrap ports must differ" in r.stderr
    parse_args(["--port", "31000"])  # distinct ports: accepted


def test_launch_pd_refuses_ports_another_deployment_holds(tmp_path):
    """A second launch_pd on the ports of a running one starts nothing (it used to load its weights
    and meanwhile take the other deployment's servers, answering /health on the same URLs, for its
    own restarted members): it says which port is taken and exits 1, and the listener on that port
    is untouched."""
    import socket

    d = make_tiny_model(str(tmp_path / "tiny"), "llama", seed=0)
    free = {flag: find_free_port() for flag in ("--prefill-port", "--decode-port", "--bootstrap-port")}
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        args = [sys.executable, "-m", "sglang.launch_pd", "--model-path", d, "--port", str(port)]
        for flag, p in free.items():
            args += [flag, str(p)]
        started = time.time()
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"router port {port} on 127.0.0.1 already in use" in r.stdout
        assert "[launch_pd] cores:" not in r.stdout and time.time() - started < 60  # nothing started
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # still the holder's
        assert busy_ports("127.0.0.1", {"router": port, "decode": free["--decode-port"]}) == [f"router port {port}"]
    assert busy_ports("127.0.0.1", {"router": port}) == []  # closed: free again
