"""keep_freed_memory: a scheduler's freed blocks stay in the process (glibc), checked in fresh
subprocesses through mallinfo2 against glibc's defaults."""

import json
import os
import platform
import subprocess
import sys

import pytest

from sglang.srt.utils.host_memory import ENV

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc thresholds only")

PROBE = r"""
import ctypes, json
from sglang.srt.utils.host_memory import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
line = keep_freed_memory()
before = libc.mallinfo2().hblkhd
block = libc.malloc(16 << 20)  # a forward's activations
ctypes.memset(block, 1, 16 << 20)
mapped = libc.mallinfo2().hblkhd - before
libc.free(block)
print(json.dumps({"line": line, "mapped": mapped, "heap_after_free": libc.mallinfo2().arena}))
"""


def probe(env_value: str) -> dict:
    env = dict(os.environ, **{ENV: env_value})
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_blocks_stay_in_the_heap():
    kept = probe("1")
    assert "kept for reuse" in kept["line"]
    assert kept["mapped"] < 1 << 20  # served from the heap, not a mapping that free() would unmap
    assert kept["heap_after_free"] >= 16 << 20  # and the heap is not trimmed on free


def test_off_switch_leaves_glibc_defaults():
    default = probe("0")
    assert ENV in default["line"]
    assert default["mapped"] >= 16 << 20  # glibc's default: a fresh mapping, unmapped on free
