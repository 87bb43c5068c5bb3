"""SGLANG_CPU_TURNS_FILE (`compute_turns`): processes on one file never hold a turn at once, a
turn held by a process that dies passes on, and without a file nothing is serialised."""

import json
import os
import subprocess
import sys
import time

from sglang.srt.utils.compute_turns import ENV, ComputeTurns

# Waits for a common start instant, then takes `n` turns of `busy` seconds (default 10 ms) of busy
# work each, back to back, and prints the (start, end) of every turn on the system-wide monotonic
# clock and how many turns it took.
WORKER = r"""
import json, sys, time
from sglang.srt.utils.compute_turns import ComputeTurns
path, n, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
busy = float(sys.argv[4]) if len(sys.argv) > 4 else 0.01
turns = ComputeTurns(path)
while time.monotonic() < start:
    time.sleep(0.001)
spans = []
for _ in range(n):
    turns.take()
    t0 = time.monotonic()
    while time.monotonic() < t0 + busy:
        pass
    spans.append((t0, time.monotonic()))
    turns.give_back()
print(json.dumps([spans, turns.turns_taken]))
"""


def _two_workers(path: str, n: int = 25):
    start = time.monotonic() + 4.0  # both interpreters are up by then
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, path, str(n), str(start)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    out = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return out


def _overlapping(a, b) -> int:
    return sum(1 for s0, e0 in a for s1, e1 in b if s0 < e1 and s1 < e0)


def test_turns_on_one_file_never_overlap(tmp_path):
    (a, taken_a), (b, taken_b) = _two_workers(str(tmp_path / "turns"))
    assert taken_a == taken_b == 25
    assert _overlapping(a, b) == 0
    # interleaved, not one after the other: the second waits for turns, not for the first to finish
    assert min(e for _, e in a) < max(s for s, _ in b) and min(e for _, e in b) < max(s for s, _ in a)


def test_without_a_file_the_same_work_overlaps():
    (a, taken_a), (b, _) = _two_workers("")
    assert taken_a == 0  # no file: take() is a no-op
    assert _overlapping(a, b) > 0


def test_a_turn_held_by_a_dead_process_passes_on(tmp_path):
    path = str(tmp_path / "turns")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from sglang.srt.utils.compute_turns import ComputeTurns\n"
                               "t = ComputeTurns(sys.argv[1]); t.take(); print('held', flush=True); time.sleep(600)", path],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = subprocess.Popen([sys.executable, "-c", "import sys\n"
                                   "from sglang.srt.utils.compute_turns import ComputeTurns\n"
                                   "ComputeTurns(sys.argv[1]).take(); print('taken')", path],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(2)
        assert waiter.poll() is None  # waits while the holder lives
        holder.kill()
        assert waiter.communicate(timeout=30)[0].strip() == "taken"
    finally:
        holder.kill()
        holder.wait()


def test_take_is_reentrant_and_give_back_idempotent(tmp_path):
    turns = ComputeTurns(str(tmp_path / "turns"))
    turns.take()
    turns.take()  # a second forward in the same step: still one turn
    assert turns.held and turns.turns_taken == 1
    turns.give_back()
    turns.give_back()
    assert not turns.held
    turns.close()
    assert not ComputeTurns(None).enabled and not ComputeTurns("").enabled
    assert ENV in ComputeTurns(os.devnull).describe()


# The asker (a prefill server with a new prompt) asks for a turn now and then while a WORKER
# takes 5 ms turns back to back (a decode server's steps); it prints when it asked and got each.
ASKER = r"""
import json, sys, time
from sglang.srt.utils.compute_turns import ComputeTurns
path, n, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
turns = ComputeTurns(path)
while time.monotonic() < start + 0.05:
    time.sleep(0.001)
waits = []
for _ in range(n):
    asked = time.monotonic()
    turns.take()
    waits.append((asked, time.monotonic()))
    turns.give_back()
    time.sleep(0.02)
print(json.dumps(waits))
"""


def test_a_waiting_scheduler_gets_the_next_turn(tmp_path):
    """A scheduler that asks for a turn gets the one after the current: one that gives its turn back
    and asks again at once (a decode loop) must not take it again first. With a bare flock the
    releaser usually wins the race, so a prefill waited several decode steps per prompt."""
    path = str(tmp_path / "turns")
    start = time.monotonic() + 4.0
    hog = subprocess.Popen([sys.executable, "-c", WORKER, path, "300", str(start), "0.005"], stdout=subprocess.PIPE,
                           text=True)
    asker = subprocess.Popen([sys.executable, "-c", ASKER, path, "20", str(start)], stdout=subprocess.PIPE, text=True)
    waits = json.loads(asker.communicate(timeout=120)[0])
    spans = json.loads(hog.communicate(timeout=120)[0])[0]
    assert hog.returncode == 0 and asker.returncode == 0
    # the hog's turns that began while the asker waited: at most one (the asker may ask just as
    # the hog's turn ends and the hog, already at the gate, goes first)
    passed = [sum(1 for s, _ in spans if asked < s < got) for asked, got in waits if got < spans[-1][0]]
    assert len(passed) >= 10 and max(passed) <= 1, passed


def test_take_says_whether_it_waited(tmp_path):
    import threading

    path = str(tmp_path / "turns")
    a, b = ComputeTurns(path), ComputeTurns(path)
    assert a.take() is False  # free: taken at once
    assert a.take() is False  # already held: a no-op
    waited = []
    taker = threading.Thread(target=lambda: waited.append(b.take()))
    taker.start()
    time.sleep(0.3)
    assert waited == []  # b waits while a holds the turn
    a.give_back()
    taker.join(timeout=10)
    assert waited == [True]
    b.give_back()
    assert a.take() is False
    a.close()
    b.close()


def test_wait_while_busy_waits_for_the_holder_and_takes_nothing(tmp_path):
    """A scheduler whose work waits on the other one (a decode server waiting for KV) sleeps while
    the other holds the turn instead of polling, and holds no turn afterwards."""
    path = str(tmp_path / "turns")
    turns = ComputeTurns(path)
    assert turns.wait_while_busy() is False  # nobody holds it: returns at once
    assert not turns.held
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from sglang.srt.utils.compute_turns import ComputeTurns\n"
                               "t = ComputeTurns(sys.argv[1]); t.take(); print('held', flush=True)\n"
                               "time.sleep(1.5); t.give_back(); print('given', flush=True); time.sleep(600)", path],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        assert turns.wait_while_busy() is True
        assert time.monotonic() - t0 > 1.0  # slept until the holder gave its turn back
        assert holder.stdout.readline().strip() == "given"
        assert not turns.held and turns.turns_taken == 0
        other = ComputeTurns(path)  # the turn is free: a third scheduler takes it without waiting
        assert other.take() is False
        other.close()
        turns.take()
        assert turns.wait_while_busy() is False  # its own turn: never waits on itself
    finally:
        holder.kill()
        holder.wait()
        turns.close()


# Starts torch's OpenMP pool (2 threads) with a parallel op, calls end_of_forward, then prints the
# process's thread count with the pool, once the call's effect has settled, and after the next op.
OMP_WORKER = r"""
import json, os, sys, time
import torch
from sglang.srt.utils.compute_turns import ComputeTurns
torch.set_num_threads(2)
turns = ComputeTurns(sys.argv[1] or None)
x = torch.randn(4_000_000)
threads = lambda: len(os.listdir("/proc/self/task"))
first = x.exp().sum().item()
with_pool = threads()
turns.end_of_forward()
deadline = time.monotonic() + 3.0
while threads() >= with_pool and time.monotonic() < deadline:
    time.sleep(0.01)
after = threads()
again = x.exp().sum().item()
print(json.dumps({"with_pool": with_pool, "after": after, "next_op": threads(), "same": again == first}))
"""


def _omp_threads(path: str) -> dict:
    out = subprocess.run([sys.executable, "-c", OMP_WORKER, path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_end_of_forward_ends_the_idle_openmp_workers_on_shared_cores(tmp_path):
    """With turns, the worker that would spin on after a forward is gone when end_of_forward returns
    (omp_pause_resource_all); the next parallel op starts it again and computes the same."""
    got = _omp_threads(str(tmp_path / "turns"))
    assert got["after"] == got["with_pool"] - 1, got
    assert got["next_op"] == got["with_pool"] and got["same"], got


def test_end_of_forward_without_turns_keeps_the_workers():
    got = _omp_threads("")
    assert got["after"] == got["with_pool"] == got["next_op"] and got["same"], got
