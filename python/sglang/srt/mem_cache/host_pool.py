"""Host (CPU-side) KV pool that decode retraction backs requests up into (`host_pool` backend).

Same layout as the device pool (its `kv_buffers()`: K and V per attention layer for an MHA pool,
one latent per layer for an MLA pool; one row per token slot) with its own page allocator and
the device pool's page size; the first page is padding. On a GPU server it is pinned
host memory; on a CPU server it is simply a second, reserved region of RAM.
"""

from __future__ import annotations

import logging
import math
from typing import List, Optional

import torch

logger = logging.getLogger(__name__)

BACKUP_ONLY_HICACHE_RATIO = 0.2


def ceil_align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def decode_retraction_hicache_ratio(max_context_len: int, kv_pool_size: int, page_size: int,
                                    host_receive_threshold: float = 1.0) -> float:
    """Upstream's backup-only ratio (reference 4.5) when neither --hicache-ratio nor --hicache-size is given.

    The host pool must hold the longest single request (context - 1 tokens, page aligned),
    twice that with host receive, and never less than BACKUP_ONLY_HICACHE_RATIO of the device pool.
    """
    min_tokens = ceil_align(min(max_context_len - 1, kv_pool_size), page_size)
    if host_receive_threshold < 1:
        min_tokens *= 2
    return max(BACKUP_ONLY_HICACHE_RATIO, min_tokens / kv_pool_size)


def host_pool_num_tokens(device_pool_size: int, page_size: int, bytes_per_token: int,
                         hicache_ratio: Optional[float], hicache_size_gb: int) -> int:
    """Host pool capacity in tokens (page aligned, padding page excluded), as HostKVCache sizes it."""
    if hicache_size_gb and hicache_size_gb > 0:
        size = int(hicache_size_gb * 1e9 // bytes_per_token)
    else:
        size = int(device_pool_size * hicache_ratio)
    page_num = size // page_size + 1  # one padding page
    return (page_num - 1) * page_size


class HostKVPool:
    def __init__(self, device_pool, num_tokens: int, page_size: int):
        self.device_pool = device_pool
        self.page_size = page_size
        self.size = num_tokens
        self.num_pages = num_tokens // page_size
        n = num_tokens + page_size
        self.buffers = [torch.empty((n,) + tuple(b.shape[1:]), dtype=b.dtype) for b in device_pool.kv_buffers()]
        self.free_pages: List[int] = list(range(1, self.num_pages + 1))
        if num_tokens <= device_pool.size:
            logger.warning(
                "HiCache host pool (%d tokens) is smaller than the device pool (%d tokens); "
                "retraction backups of the whole device pool cannot all be kept.", num_tokens, device_pool.size,
            )

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def alloc(self, num_tokens: int) -> Optional[torch.Tensor]:
        pages = math.ceil(num_tokens / self.page_size)
        if pages > len(self.free_pages):
            return None
        taken, self.free_pages = self.free_pages[:pages], self.free_pages[pages:]
        base = torch.tensor(taken, dtype=torch.int64) * self.page_size
        return (base[:, None] + torch.arange(self.page_size)).flatten()[:num_tokens]

    def free(self, host_indices: torch.Tensor) -> None:
        if host_indices is None or host_indices.numel() == 0:
            return
        self.free_pages.extend(torch.unique(host_indices // self.page_size).tolist())

    def backup_from_device(self, device_indices: torch.Tensor, host_indices: torch.Tensor) -> None:
        dev = device_indices.to(self.device_pool.device)
        for host, device in zip(self.buffers, self.device_pool.kv_buffers()):
            host[host_indices] = device[dev].cpu()

    def load_to_device(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> None:
        dev = device_indices.to(self.device_pool.device)
        for host, device in zip(self.buffers, self.device_pool.kv_buffers()):
            device[dev] = host[host_indices].to(device.device)
