"""How a scheduler process keeps the host memory its steps free (CPU serving, glibc).

Every forward allocates the same large tensors again: a batch-64 decode step's logits are 12 MB,
a 64 x 32 prefill's activations tens of MB. By default glibc serves allocations above its mmap
threshold with fresh mappings and unmaps them on free, and gives the heap's free top back to the
kernel beyond its trim threshold; either way the next step faults every page in again. On a VM
whose host reclaims freed guest pages a fault costs ~9 us (measured on the dev machine: a 64 x 32
x 48 generate took 55,000 faults and 500 ms more in one run of two; with the thresholds raised its
scheduler took 28). `keep_freed_memory` raises both thresholds, so the process reuses what it
freed, as the caching allocators of GPU runtimes do; its RSS then stays at its high-water mark
(the largest forward's activations on top of weights and pools).

`SGLANG_CPU_KEEP_FREED_MEMORY=0` leaves glibc's defaults. Other C libraries: nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
import platform

ENV = "SGLANG_CPU_KEEP_FREED_MEMORY"
# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit); larger blocks stay mmapped
TRIM_THRESHOLD = 1 << 30  # keep up to 1 GiB of free heap top
TOP_PAD = 64 << 20  # grow the heap 64 MB at a time


def keep_freed_memory() -> str:
    """Sets this process's glibc thresholds (see the module docstring); returns a log line."""
    if os.environ.get(ENV, "1") == "0":
        return f"host allocator: glibc defaults ({ENV}=0)"
    if platform.libc_ver()[0] != "glibc":
        return "host allocator: not glibc, left as it is"
    libc = ctypes.CDLL(None)
    results = [libc.mallopt(param, value) for param, value in (  # each applied even if one is refused
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD))]
    if results != [1, 1, 1]:
        return "host allocator: glibc refused some of the thresholds"
    return (f"host allocator: freed memory kept for reuse (glibc mmap threshold {MMAP_THRESHOLD >> 20} MB, "
            f"trim threshold {TRIM_THRESHOLD >> 20} MB; {ENV}=0 to turn off)")


def return_freed_memory() -> None:
    """Gives the heap's free pages back to the kernel (glibc malloc_trim; elsewhere nothing): after
    loading, where the weights' packing freed copies as large as the model."""
    if platform.libc_ver()[0] == "glibc":
        ctypes.CDLL(None).malloc_trim(0)


# ---- transparent huge pages for the weights every step streams ---------------------------------
# A decode step reads every weight once (268 MB for SmolLM2-135M in bf16). In 4 KB pages that is a
# TLB miss and a page walk every 64 cache lines, and the CPU's stream prefetchers stop at every 4 KB
# boundary; in 2 MB pages neither happens. Linux gives a
# process huge pages where it asks for them (madvise) in THP's default "madvise" mode, and
# everywhere in "always" mode; weights packed into such a mapping made a batch-1 sweep over the
# default model's linears ~20% faster on the dev machine.

HUGE_PAGE = 2 << 20
THP_ENV = "SGLANG_CPU_HUGE_PAGES"
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def transparent_huge_pages() -> str:
    """The kernel's THP mode ("always", "madvise" or "never"), "" where there is none to read."""
    try:
        with open(_THP_SETTING) as f:
            text = f.read()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else ""


def huge_pages_wanted() -> bool:
    """Whether `huge_page_buffer` asks for huge pages: on Linux with THP "always" or "madvise",
    unless SGLANG_CPU_HUGE_PAGES=0."""
    return os.environ.get(THP_ENV, "1") != "0" and transparent_huge_pages() in ("always", "madvise")


def huge_page_buffer(nbytes: int):
    """A uint8 tensor of `nbytes` bytes starting on a 2 MB boundary of an anonymous mapping advised
    for transparent huge pages (MADV_HUGEPAGE, before any page is touched), or None when
    `huge_pages_wanted()` says no or the mapping fails. The tensor keeps the mapping alive."""
    import mmap

    import torch

    if nbytes <= 0 or not huge_pages_wanted() or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    size = (nbytes + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE + HUGE_PAGE
    try:
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return None
    whole = torch.frombuffer(mapping, dtype=torch.uint8)
    start = (-whole.data_ptr()) % HUGE_PAGE
    return whole[start:start + nbytes]


def huge_page_views(layout):
    """Zero tensors of the (shape, dtype) pairs in `layout`, side by side (each on a 64-byte
    boundary) in one `huge_page_buffer`, in order; None when there is no such buffer."""
    import torch

    sizes = [torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size() for shape, dtype in layout]
    offsets, total = [], 0
    for nbytes in sizes:
        offsets.append(total)
        total += (nbytes + 63) // 64 * 64
    buf = huge_page_buffer(total)
    if buf is None:
        return None
    return [buf[off:off + nbytes].view(dtype).view(shape)
            for (shape, dtype), off, nbytes in zip(layout, offsets, sizes)]
