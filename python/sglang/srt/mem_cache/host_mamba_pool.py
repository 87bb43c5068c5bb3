"""The host tier of the `MambaPool` for PD decode retraction backups (a fork addition; upstream's
host pool holds KV pages only and refuses hybrid SSM models).

Laid out like the device pool: per Mamba layer, `size` slots of conv state and `size` slots of
temporal (SSM) state with the device dtypes; a backed-up request holds one slot. Size
(`host_mamba_slots`): `--mamba-host-pool-slots` when given, else one slot per page the host KV
pool holds (a backup holds at least one page, so the KV tier runs out no later than this one)
capped at the device pool's slot count, i.e. `min(device slots, host KV tokens // page size)`.
"""

from __future__ import annotations

from typing import List, Optional

import torch


def host_mamba_slots(explicit: Optional[int], device_slots: int, host_kv_tokens: int, page_size: int) -> int:
    if explicit is not None:
        return max(int(explicit), 0)
    return max(1, min(int(device_slots), int(host_kv_tokens) // max(int(page_size), 1)))


class HostMambaPool:
    def __init__(self, device_pool, size: int):
        self.device_pool = device_pool
        self.size = int(size)
        layers = device_pool.num_mamba_layers
        self.conv_state = torch.zeros((layers, self.size) + device_pool.conv_shape, dtype=device_pool.dtype)
        self.ssm_state = torch.zeros((layers, self.size) + device_pool.ssm_shape, dtype=device_pool.ssm_dtype)
        self._free: List[int] = list(range(self.size))

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> Optional[int]:
        return self._free.pop(0) if self._free else None

    def free(self, slot: int) -> None:
        slot = int(slot)
        if not 0 <= slot < self.size or slot in self._free:
            raise AssertionError(f"host Mamba slot {slot} freed twice or out of range")
        self._free.append(slot)

    def backup_from_device(self, device_slot: int, host_slot: int) -> None:
        self.conv_state[:, host_slot].copy_(self.device_pool.conv_state[:, int(device_slot)])
        self.ssm_state[:, host_slot].copy_(self.device_pool.ssm_state[:, int(device_slot)])

    def load_to_device(self, host_slot: int, device_slot: int) -> None:
        self.device_pool.conv_state[:, int(device_slot)].copy_(self.conv_state[:, host_slot])
        self.device_pool.ssm_state[:, int(device_slot)].copy_(self.ssm_state[:, host_slot])

    def nbytes(self) -> int:
        return self.conv_state.nbytes + self.ssm_state.nbytes
