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


# ---- transparent huge pages ----------------------------------------------------------------


def _smaps_field(address: int, field: str) -> int:
    """`field` (kB, or a flag) of the mapping of this process that holds `address`."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and ":" not in head[0]:
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                inside = lo <= address < hi
            elif inside and head[0] == field + ":":
                return int(head[1])
    raise AssertionError(f"no {field} for {address:#x}")


def test_into_huge_pages_copies_side_by_side_in_an_advised_mapping(monkeypatch):
    import torch

    from sglang.srt.utils.host_memory import HUGE_PAGE, THP_ENV, huge_pages_wanted, into_huge_pages

    monkeypatch.delenv(THP_ENV, raising=False)
    if not huge_pages_wanted():
        pytest.skip("no transparent huge pages on this kernel (or THP is off)")
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(300, 577, generator=g), torch.randn(3, 5, generator=g).bfloat16(),
               torch.randint(-127, 128, (4096, 33), generator=g, dtype=torch.int8)]
    moved = into_huge_pages(tensors)
    assert moved[0].data_ptr() % HUGE_PAGE == 0
    for src, dst in zip(tensors, moved):
        assert dst.dtype == src.dtype and dst.shape == src.shape and dst.is_contiguous()
        assert torch.equal(src, dst) and dst.data_ptr() != src.data_ptr() and dst.data_ptr() % 64 == 0
    assert moved[1].data_ptr() == moved[0].data_ptr() + (300 * 577 * 4 + 63) // 64 * 64  # side by side
    moved[0].zero_()
    assert tensors[0].abs().sum() > 0  # copies, not views of the originals
    # the kernel took the advice for the mapping (actual huge pages depend on free memory)
    assert _smaps_field(moved[0].data_ptr(), "THPeligible") == 1
    monkeypatch.setenv(THP_ENV, "0")
    assert not huge_pages_wanted()
    kept = into_huge_pages(tensors)
    assert all(a is b for a, b in zip(kept, tensors))


def test_weights_into_huge_pages_keeps_what_the_linears_compute(monkeypatch):
    import torch

    from sglang.srt.layers import cpu_ops
    from sglang.srt.layers.linear import ReplicatedLinear, is_panel_weight, module_linear, pack_linear_weights
    from sglang.srt.layers.linear import weights_into_huge_pages
    from sglang.srt.utils.host_memory import THP_ENV, huge_pages_wanted

    monkeypatch.delenv(THP_ENV, raising=False)
    if not (huge_pages_wanted() and cpu_ops.linear_panels_enabled(torch.bfloat16)):
        pytest.skip(f"needs THP and bf16 panels: {cpu_ops.describe()}")
    layers = torch.nn.ModuleList([ReplicatedLinear(96, 64), ReplicatedLinear(64, 128)]).to(torch.bfloat16)
    for m in layers:
        m.weight.data.normal_(0, 0.1)
    pack_linear_weights(layers)
    x = torch.randn(5, 96).bfloat16()
    before = module_linear(layers[1], module_linear(layers[0], x))
    old = [m.packed_weight for m in layers]
    assert weights_into_huge_pages(layers) == sum(t.numel() * t.element_size() for t in old)
    assert all(is_panel_weight(m.packed_weight) and m.packed_weight is not t for m, t in zip(layers, old))
    assert torch.equal(module_linear(layers[1], module_linear(layers[0], x)), before)
    monkeypatch.setenv(THP_ENV, "0")
    assert weights_into_huge_pages(layers) == 0
