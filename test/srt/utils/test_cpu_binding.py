"""SGLANG_CPU_OMP_THREADS_BIND: parsing, launch_pd's cores and turns per role, and a real bind in a subprocess."""

import os
import subprocess
import sys

import pytest

from sglang.srt.disaggregation.launch_pd import role_core_binding, turns_env
from sglang.srt.utils.compute_turns import ENV as TURNS_ENV
from sglang.srt.utils.cpu_binding import ENV, available_cores, cores_for_rank, cores_overlap, format_cores, parse_core_list


def test_core_lists_round_trip():
    assert parse_core_list("0-3,8") == [0, 1, 2, 3, 8]
    assert parse_core_list(" 2, 0 ") == [0, 2]
    assert format_cores([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    for bad in ("", "a", "3-1", "1-x"):
        with pytest.raises(ValueError, match=ENV):
            parse_core_list(bad)


def test_ranks_and_unavailable_cores():
    first = available_cores()[0]
    assert cores_for_rank(None) is None and cores_for_rank("all") is None
    assert cores_for_rank(f"{first}|{first}", rank=1) == [first]
    with pytest.raises(ValueError, match="rank 2 has none"):
        cores_for_rank(f"{first}|{first}", rank=2)
    with pytest.raises(ValueError, match="not available to this process"):
        cores_for_rank("100000")


def test_launch_pd_binding_per_role():
    every = format_cores(available_cores())
    assert role_core_binding({}) == {"prefill": every, "decode": every}
    assert role_core_binding({ENV: "0-1|2-3"}) == {"prefill": "0-1", "decode": "2-3"}
    assert role_core_binding({ENV: "0-1"}) == {"prefill": "0-1", "decode": "0-1"}
    assert role_core_binding({ENV: "all"}) == {"prefill": "all", "decode": "all"}
    with pytest.raises(ValueError, match="one core list, or two"):
        role_core_binding({ENV: "0|1|2"})


def test_servers_take_turns_exactly_when_their_cores_overlap(tmp_path):
    assert cores_overlap("0-1", "1-2") and cores_overlap("all", "0") and not cores_overlap("0", "1")
    d = str(tmp_path)
    assert turns_env({}, role_core_binding({}), d) == {TURNS_ENV: os.path.join(d, "compute_turns")}
    assert turns_env({}, {"prefill": "0-3", "decode": "2-5"}, d) == {TURNS_ENV: os.path.join(d, "compute_turns")}
    assert turns_env({}, {"prefill": "0", "decode": "1"}, d) == {}  # a split: each alone on its cores
    assert turns_env({TURNS_ENV: ""}, role_core_binding({}), d) == {}  # set by the user (empty: no turns)


def test_bind_scheduler_pins_the_process_and_its_threads():
    core = available_cores()[-1]
    code = ("import os, torch; from sglang.srt.utils.cpu_binding import bind_scheduler; line = bind_scheduler(); "
            "print(sorted(os.sched_getaffinity(0)), torch.get_num_threads(), line)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, ENV: str(core), "OMP_NUM_THREADS": "4"},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith(f"[{core}] 1 CPU threads: 1, bound to cores {core}"), out
