"""launch_pd's supervision policy on real (trivial) processes: a member that exits is restarted
with a backoff; past --max-restarts the deployment shuts down (exit 1) and leaves no process."""

import subprocess
import sys
import threading
import time

from sglang.srt.disaggregation import pd_supervisor
from sglang.srt.disaggregation.pd_supervisor import Deployment, Member

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


def _member(name):
    return Member(name, SLEEPER, f"proc://{name}", 5, wait_healthy=lambda url, proc, timeout: None)


def _deployment(max_restarts):
    members = [_member("prefill"), _member("decode"), _member("router")]
    slept = []
    dep = Deployment(members, max_restarts=max_restarts, sleep=lambda s: (slept.append(s), time.sleep(0.01)))
    return dep, members, slept


def test_a_dead_member_is_restarted_with_backoff_then_the_deployment_gives_up(capsys):
    dep, (prefill, decode, router), slept = _deployment(max_restarts=2)
    dep.start()
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("code", dep.supervise(poll_s=0.02)), daemon=True)
    t.start()
    first = decode.proc
    first.kill()
    _wait(lambda: decode.proc is not first and decode.proc.poll() is None)
    second = decode.proc
    second.kill()
    _wait(lambda: decode.proc is not second and decode.proc.poll() is None)
    decode.proc.kill()  # a third death within the window: past --max-restarts 2
    t.join(10)
    assert result.get("code") == 1
    assert [s for s in slept if s >= 1] == [1.0, 2.0]  # exponential backoff between restarts
    out = capsys.readouterr().out
    assert "the decode server exited with code -9; restarting it in 1 s" in out
    assert "shutting the deployment down" in out
    dep.stop()
    assert all(m.proc.poll() is not None for m in (prefill, decode, router))
    assert prefill.proc.returncode is not None and router.proc.returncode is not None


def test_max_restarts_zero_shuts_down_at_the_first_death(capsys):
    dep, (prefill, decode, router), _ = _deployment(max_restarts=0)
    dep.start()
    router.proc.kill()
    assert dep.supervise(poll_s=0.02) == 1
    dep.stop()
    assert all(m.proc.poll() is not None for m in (prefill, decode, router))
    assert "the router server exited" in capsys.readouterr().out


def test_stop_waits_for_every_member_and_kills_a_stuck_one(monkeypatch):
    monkeypatch.setattr(pd_supervisor, "STOP_TIMEOUT_S", 1.0)
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      "print('up', flush=True); time.sleep(300)"]
    m = Member("decode", stubborn, "proc://decode", 5, wait_healthy=lambda url, proc, timeout: None)
    m.proc = subprocess.Popen(stubborn, stdout=subprocess.PIPE)
    m.proc.stdout.readline()  # SIGTERM is ignored from here on
    dep = Deployment([_member("prefill"), m, _member("router")], max_restarts=0)
    for other in (dep.members[0], dep.members[2]):
        other.start()
    t0 = time.time()
    dep.stop()
    assert time.time() - t0 < 10
    assert all(x.proc.poll() is not None for x in dep.members)


def _wait(cond, timeout=10.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline
        time.sleep(0.02)
