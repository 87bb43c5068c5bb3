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


def test_huge_page_views_lie_side_by_side_in_an_advised_mapping(monkeypatch):
    import torch

    from sglang.srt.utils.host_memory import HUGE_PAGE, THP_ENV, huge_page_views, huge_pages_wanted

    monkeypatch.delenv(THP_ENV, raising=False)
    if not huge_pages_wanted():
        pytest.skip("no transparent huge pages on this kernel (or THP is off)")
    layout = [((300, 577), torch.float32), ((3, 5), torch.bfloat16), ((4096, 33), torch.int8)]
    views = huge_page_views(layout)
    assert views[0].data_ptr() % HUGE_PAGE == 0
    for (shape, dtype), view in zip(layout, views):
        assert view.dtype == dtype and tuple(view.shape) == shape and view.is_contiguous()
        assert view.data_ptr() % 64 == 0 and not view.any()  # an anonymous mapping starts zeroed
    assert views[1].data_ptr() == views[0].data_ptr() + (300 * 577 * 4 + 63) // 64 * 64  # side by side
    assert views[2].data_ptr() == views[1].data_ptr() + 64
    views[1].fill_(1.0)
    assert not views[0].any() and not views[2].any()  # no overlap
    # the kernel took the advice for the mapping (actual huge pages depend on free memory); under THP
    # "always" every mapping is eligible, so only "madvise" shows the advice itself
    assert _smaps_field(views[0].data_ptr(), "THPeligible") == 1
    monkeypatch.setenv(THP_ENV, "0")
    assert not huge_pages_wanted() and huge_page_views(layout) is None


def _linears(dtype):
    import torch

    from sglang.srt.layers.linear import ReplicatedLinear

    layers = torch.nn.ModuleList([ReplicatedLinear(96, 64), ReplicatedLinear(64, 128)]).to(dtype)
    for m in layers:
        m.weight.data.normal_(0, 0.1)
    return layers


@pytest.mark.parametrize("int8", [False, True], ids=["panels", "int8"])
def test_weights_into_huge_pages_keeps_what_the_linears_compute(monkeypatch, int8):
    import torch

    from sglang.srt.layers import cpu_ops, quantization
    from sglang.srt.layers.linear import is_panel_weight, module_linear, pack_linear_weights
    from sglang.srt.layers.linear import weights_into_huge_pages
    from sglang.srt.utils import host_memory

    monkeypatch.delenv(host_memory.THP_ENV, raising=False)
    if not (host_memory.huge_pages_wanted() and cpu_ops.linear_panels_enabled(torch.bfloat16)):
        pytest.skip(f"needs THP and bf16 panels: {cpu_ops.describe()}")
    layers = _linears(torch.bfloat16)
    if int8:
        quantization.quantize_linear_weights_int8(layers)
    pack_linear_weights(layers)
    x = torch.randn(3 if int8 else 5, 96).bfloat16()  # int8: few rows, the int8 kernel's
    before = module_linear(layers[1], module_linear(layers[0], x))
    old = [m.int8_weight if int8 else m.packed_weight for m in layers]
    moved = [t[0] if int8 else t for t in old]
    assert weights_into_huge_pages(layers) == sum(t.numel() * t.element_size() for t in moved) + (
        sum(m.packed_weight.numel() * m.packed_weight.element_size() for m in layers) if int8 else 0)
    for m, t in zip(layers, old):
        assert is_panel_weight(m.packed_weight)
        if int8:
            assert m.int8_weight[0] is not t[0] and torch.equal(m.int8_weight[0], t[0])
            assert m.int8_weight[1] is t[1]  # the scales stay
        else:
            assert m.packed_weight is not t and torch.equal(m.packed_weight, t)
    assert torch.equal(module_linear(layers[1], module_linear(layers[0], x)), before)
    monkeypatch.setenv(host_memory.THP_ENV, "0")
    assert weights_into_huge_pages(layers) == 0


def test_weights_stay_where_they_are_when_no_mapping_is_given(monkeypatch):
    """A refused mapping (or THP "never"): nothing moves and nothing is reported as moved."""
    import torch

    from sglang.srt.layers import cpu_ops
    from sglang.srt.layers.linear import pack_linear_weights, weights_into_huge_pages
    from sglang.srt.utils import host_memory

    if not cpu_ops.linear_panels_enabled(torch.bfloat16):
        pytest.skip(f"needs bf16 panels: {cpu_ops.describe()}")
    layers = _linears(torch.bfloat16)
    pack_linear_weights(layers)
    old = [m.packed_weight for m in layers]
    monkeypatch.delenv(host_memory.THP_ENV, raising=False)
    monkeypatch.setattr(host_memory, "transparent_huge_pages", lambda: "madvise")
    monkeypatch.setattr(host_memory, "huge_page_buffer", lambda nbytes: None)
    assert weights_into_huge_pages(layers) == 0
    assert all(m.packed_weight is t for m, t in zip(layers, old))
