"""One command for a whole PD deployment on one machine: prefill server + decode server + router.

    python -m sglang.launch_pd --model-path default [--port 30000] [-- <flags for both servers>]

Per-role flags come from role templates: the flags in `PREFILL_TEMPLATE` / `DECODE_TEMPLATE`
plus the user's common flags, where a decode-only flag (`--disaggregation-decode-*`,
`--num-reserved-decode-tokens`) never reaches the prefill server. Each role's flag set goes
through `sglang.check_server_args` first, so a wrong combination fails in a second, before any
weights load. The router is the real `sglang-router` when installed (`--router rust|mini-lb`),
else the in-tree `sglang.srt.router.mini_lb`.

Cores (CPU serving), through upstream's `SGLANG_CPU_OMP_THREADS_BIND` (see
`sglang.srt.utils.cpu_binding`): unset, both schedulers get every core this process may use;
one list: both get it; "P|D" (e.g. "0-3|4-7"): prefill P, decode D; "all": no binding. Two
schedulers whose cores overlap take turns (`sglang.srt.utils.compute_turns`: one batch at a
time, each with all its cores; launch_pd sets `SGLANG_CPU_TURNS_FILE` to a file of its own
unless the variable is set; empty: no turns). Measured on 2 cores (benchmark/RESULTS.md):
sharing by turns serves more than a split and prefills sooner, the split streams each token
faster (decode alone on its core, never behind a prefill): "0|1" chooses it.

Trust: launch_pd gives its members one secret through the environment
(`SGLANG_DISAGGREGATION_SECRET`, generated unless set) that authenticates the bootstrap registration
and the KV control frames, and limits the decode server's `bootstrap_host` to this deployment's
bootstrap server (`SGLANG_DISAGGREGATION_BOOTSTRAP_HOSTS`); see `sglang.srt.disaggregation.pd_auth`.

The prefill server gets `--optimistic-prefill-attempts 1` unless the flags set it: a prompt is
prefilled while the decode server takes the request in and reserves its KV slots, not after
(`sglang.srt.disaggregation.prefill`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Mapping, Sequence

DECODE_ONLY_PREFIXES = ("--disaggregation-decode-", "--num-reserved-decode-tokens")
PREFILL_ONLY_PREFIXES = ("--disaggregation-bootstrap-port",)


def _split_flags(flags: Sequence[str]) -> List[List[str]]:
    """Groups a flat argv into [flag, values...] items."""
    groups: List[List[str]] = []
    for tok in flags:
        if tok.startswith("--") or not groups:
            groups.append([tok])
        else:
            groups[-1].append(tok)
    return groups


def role_flags(role: str, common: Sequence[str], args) -> List[str]:
    """Flags for one role: its template plus the common flags meant for it."""
    out = ["--model-path", args.model_path, "--host", args.host, "--disaggregation-mode", role,
           "--disaggregation-transfer-backend", args.transfer_backend]
    if role == "prefill":
        out += ["--port", str(args.prefill_port), "--disaggregation-bootstrap-port", str(args.bootstrap_port)]
    else:
        out += ["--port", str(args.decode_port),
                "--disaggregation-decode-retraction-backup", args.decode_retraction_backup]
    groups = _split_flags(common)
    given = {g[0].split("=", 1)[0] for g in groups}
    if "--enable-metrics" not in given:
        out.append("--enable-metrics")  # a deployment is operated: /metrics on both servers
    if role == "prefill" and "--optimistic-prefill-attempts" not in given:
        # prefill at once, while the decode server takes the request in and reserves its slots
        out += ["--optimistic-prefill-attempts", "1"]
    for group in groups:
        flag = group[0].split("=", 1)[0]
        if role == "prefill" and flag.startswith(DECODE_ONLY_PREFIXES):
            continue
        if role == "decode" and flag.startswith(PREFILL_ONLY_PREFIXES):
            continue
        out += group
    return out


def role_core_binding(environ: Mapping[str, str]) -> Dict[str, str]:
    """SGLANG_CPU_OMP_THREADS_BIND for each server (see the module docstring)."""
    from sglang.srt.utils.cpu_binding import ENV, available_cores, format_cores

    spec = environ.get(ENV)
    if spec is None:
        every = format_cores(available_cores())
        return {"prefill": every, "decode": every}
    groups = spec.split("|")
    if len(groups) == 1:
        return {"prefill": spec, "decode": spec}
    if len(groups) == 2:
        return {"prefill": groups[0], "decode": groups[1]}
    raise ValueError(f"{ENV}={spec!r}: launch_pd takes one core list, or two ('prefill|decode')")


def turns_env(environ: Mapping[str, str], cores: Mapping[str, str], directory: str) -> Dict[str, str]:
    """SGLANG_CPU_TURNS_FILE for both servers: a file in `directory` when their cores overlap and
    the variable is not set (set, even empty, it is the user's)."""
    from sglang.srt.utils.compute_turns import ENV as TURNS_ENV
    from sglang.srt.utils.cpu_binding import cores_overlap

    if TURNS_ENV in environ or not cores_overlap(cores["prefill"], cores["decode"]):
        return {}
    return {TURNS_ENV: os.path.join(directory, "compute_turns")}


def trust_env(environ: Mapping[str, str], args) -> Dict[str, Dict[str, str]]:
    """Per member, the environment that makes the deployment trust only itself (pd_auth.py): one
    shared secret (the user's SGLANG_DISAGGREGATION_SECRET when set, so that servers started by
    hand can join; else a fresh one), through the environment, never argv, which `ps` shows; and a
    decode server that connects for KV only to this deployment's bootstrap server, unless the
    user chose SGLANG_DISAGGREGATION_BOOTSTRAP_HOSTS."""
    from sglang.srt.disaggregation import pd_auth

    secret = {pd_auth.SECRET_ENV: environ.get(pd_auth.SECRET_ENV) or pd_auth.generate_secret()}
    host = f"[{args.host}]" if ":" in args.host else args.host
    hosts = {} if pd_auth.BOOTSTRAP_HOSTS_ENV in environ else {pd_auth.BOOTSTRAP_HOSTS_ENV: f"{host}:{args.bootstrap_port}"}
    return {"prefill": dict(secret), "decode": {**secret, **hosts}, "router": dict(secret)}


def check_role(flags: List[str]) -> None:
    from sglang.check_server_args import main as check_main

    code = check_main(flags)
    if code != 0:
        raise SystemExit(code)


def router_cmd(args) -> List[str]:
    prefill = f"http://{args.host}:{args.prefill_port}"
    decode = f"http://{args.host}:{args.decode_port}"
    use_rust = args.router in ("rust", "mini-lb") and importlib.util.find_spec("sglang_router") is not None
    if use_rust:
        # A restarted member is probed back in within seconds (defaults: 60 s health checks, 60 s open circuit).
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
               "--prefill", prefill, str(args.bootstrap_port), "--decode", decode,
               "--host", args.host, "--port", str(args.port),
               "--prometheus-host", args.host, "--prometheus-port", str(_router_metrics_port(args.host)),
               "--log-level", args.router_log_level, "--health-check-interval-secs", "5",
               "--cb-timeout-duration-secs", "15"]
        return cmd + (["--mini-lb"] if args.router == "mini-lb" else [])
    return [sys.executable, "-m", "sglang.srt.router.mini_lb", "--host", args.host, "--port", str(args.port),
            "--prefill", prefill, "--decode", decode, "--prefill-bootstrap-ports", str(args.bootstrap_port)]


def _router_metrics_port(host: str, preferred: int = 29000) -> int:
    """The router's Prometheus port: its default 29000 unless taken (it would panic), else a free one."""
    import socket

    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
                return sock.getsockname()[1]
            except OSError:
                continue
    return 0


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    import requests

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with code {proc.returncode} during start-up")
        try:
            if requests.get(url + "/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} was not healthy within {timeout:.0f} s")


# What each port of the deployment is for, its flag, and its attribute in the parsed args.
PORTS = (("router", "--port", "port"), ("prefill", "--prefill-port", "prefill_port"),
         ("decode", "--decode-port", "decode_port"), ("bootstrap", "--bootstrap-port", "bootstrap_port"))


def busy_ports(host: str, ports: Mapping[str, int]) -> List[str]:
    """The ones of `ports` (named by what they are for) that a process on this machine already
    listens on. launch_pd starts nothing then: its members would fail to bind only after loading
    their weights, and meanwhile its health checks reached the other deployment's servers on the
    same URLs, taking them for its own (re)started members."""
    busy = []
    for what, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed server's TIME_WAIT is no owner
            try:
                s.bind((host, port))
            except OSError:
                busy.append(f"{what} port {port}")
    return busy


def parse_args(argv: Sequence[str]):
    argv = list(argv)
    common: List[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, common = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m sglang.launch_pd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default="default", help="HF folder, or 'default' (packaged SmolLM2-135M-Instruct)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="router port (what clients call)")
    p.add_argument("--prefill-port", type=int, default=30100)
    p.add_argument("--decode-port", type=int, default=30200)
    p.add_argument("--bootstrap-port", type=int, default=8998)
    p.add_argument("--transfer-backend", default="mooncake_tcp", choices=["mooncake", "mooncake_tcp"])
    p.add_argument("--decode-retraction-backup", default="host_pool", choices=["cpu_tensor", "host_pool", "none"])
    p.add_argument("--router", default="rust", choices=["rust", "mini-lb", "in-tree"],
                   help="rust/mini-lb: the sglang-router package; in-tree: sglang.srt.router.mini_lb")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--max-restarts", type=int, default=3,
                   help="restarts of one member within 10 minutes before the deployment shuts down (0: never restart)")
    p.add_argument("--router-log-level", default="warn", choices=["debug", "info", "warn", "error"],
                   help="sglang-router log level (info logs every request, health checks included)")
    p.add_argument("--check-only", action="store_true", help="validate both roles' flags and exit")
    args = p.parse_args(argv)
    seen: Dict[int, str] = {}
    for _, flag, attr in PORTS:
        port = getattr(args, attr)
        if port in seen:
            p.error(f"{seen[port]} and {flag} are both {port}: the router, prefill, decode and bootstrap ports must differ")
        seen[port] = flag
    return args, common


def main(argv: Sequence[str] = None) -> int:
    from sglang.srt.disaggregation.pd_supervisor import Deployment, Member, log
    from sglang.srt.entrypoints.web_ui import WEB_API_BASE_ENV

    args, common = parse_args(sys.argv[1:] if argv is None else argv)
    roles = {role: role_flags(role, common, args) for role in ("prefill", "decode")}
    for role, flags in roles.items():
        print(f"[launch_pd] checking {role} flags: {' '.join(flags)}", flush=True)
        check_role(flags)
    if args.check_only:
        return 0
    busy = busy_ports(args.host, {what: getattr(args, attr) for what, _, attr in PORTS})
    if busy:
        print(f"[launch_pd] cannot start: {', '.join(busy)} on {args.host} already in use (another deployment "
              f"running?); stop it or choose {' / '.join(flag for _, flag, _ in PORTS)}", flush=True)
        return 1
    base = f"http://{args.host}"
    from sglang.srt.utils.cpu_binding import ENV

    cores = role_core_binding(os.environ)
    workdir = tempfile.mkdtemp(prefix="sglang-launch-pd-")
    turns = turns_env(os.environ, cores, workdir)
    how = "; they take turns (SGLANG_CPU_TURNS_FILE)" if turns else ""
    print(f"[launch_pd] cores: prefill {cores['prefill']}, decode {cores['decode']} ({ENV}){how}", flush=True)
    # The web page of each server sends its chat through the router (a PD server alone cannot
    # serve a request) and shows its own server's state.
    web_env = {WEB_API_BASE_ENV: f"{base}:{args.port}"}
    trust = trust_env(os.environ, args)
    members = [
        Member(role, [sys.executable, "-m", "sglang.launch_server", *roles[role]],
               f"{base}:{args.prefill_port if role == 'prefill' else args.decode_port}", args.startup_timeout,
               wait_healthy, env={**os.environ, ENV: cores[role], **turns, **web_env, **trust[role]})
        for role in ("prefill", "decode")
    ]
    members.append(Member("router", router_cmd(args), f"{base}:{args.port}", 120, wait_healthy,
                          env={**os.environ, **trust["router"]}))
    deployment = Deployment(members, max_restarts=args.max_restarts)

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    # SIGINT explicitly too: a script's background job starts with SIGINT ignored, where Python
    # installs no KeyboardInterrupt handler, and `kill -INT` must still stop the deployment.
    signal.signal(signal.SIGINT, on_signal)
    try:
        deployment.start()
        log(f"PD deployment ready: http://{args.host}:{args.port} (prefill :{args.prefill_port}, "
            f"decode :{args.decode_port}, bootstrap :{args.bootstrap_port})")
        log(f"web page: http://{args.host}:{args.decode_port}/ (chat through the router, the decode "
            f"server's live view; the prefill's at :{args.prefill_port}/)")
        return deployment.supervise()
    except KeyboardInterrupt:
        return 0
    except Exception as e:  # noqa: BLE001 - a member failed to start: say which, stop the rest
        log(f"the deployment failed to start: {e}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        deployment.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
