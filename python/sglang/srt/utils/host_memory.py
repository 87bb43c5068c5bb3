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
