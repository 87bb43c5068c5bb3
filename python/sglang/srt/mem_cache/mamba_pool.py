"""Per-request recurrent state of Mamba2 hybrid models (NemotronH, Falcon-H1): the `MambaPool`.

A Mamba2 layer carries two states from one forward to the next, and unlike attention KV they
do not grow with the sequence: the conv state (the last `d_conv - 1` inputs of the depthwise
conv, `[conv_dim, d_conv - 1]`) and the SSM state (`[heads, head_dim, d_state]`). A request owns
one slot for its lifetime; every Mamba layer has its row for that slot:

    conv_state [mamba_layers, size + 1, conv_dim, d_conv - 1]   (model dtype)
    ssm_state  [mamba_layers, size + 1, heads, head_dim, d_state] (--mamba-ssm-dtype)

Slot 0 is padding (never allocated, like the KV pool's first page), so valid slots are
1..size. Layer-major tensors keep each layer's slots contiguous: `state_tensors()` hands one
`[size + 1, ...]` tensor per (state, layer) to the PD transfer engine, where slot `s` starts at
`ptr + s * item_len`.

Sizing (`mamba_cache_size`): `--max-mamba-cache-size` when given; else, without prefix caching
of states, one slot per running request (`--max-running-requests`, 512 when unset, as
upstream); with prefix caching, the states get `ratio / (1 + ratio)` of the memory shared with
the KV pool (`--mamba-full-memory-ratio`, fallback 0.9).
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

logger = logging.getLogger(__name__)

GB = 1 << 30
MAMBA_FULL_MEMORY_RATIO_FALLBACK = 0.9
DEFAULT_MAX_MAMBA_CACHE_SIZE = 512  # upstream's value when neither size nor max_running_requests is set

_SSM_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

SlotsLike = Union[int, Sequence[int], torch.Tensor]


def _as_slot_list(slots: SlotsLike) -> List[int]:
    if isinstance(slots, torch.Tensor):
        return [int(s) for s in slots.reshape(-1).tolist()]
    if isinstance(slots, int):
        return [slots]
    return [int(s) for s in slots]


class MambaPool:
    def __init__(
        self,
        size: int,
        num_mamba_layers: int,
        conv_shape: Tuple[int, int],
        ssm_shape: Tuple[int, int, int],
        dtype: torch.dtype,
        ssm_dtype: Optional[torch.dtype] = None,
        device: str = "cpu",
    ):
        if size <= 0:
            raise ValueError(f"MambaPool needs at least one slot, got size={size}")
        self.size = int(size)
        self.num_mamba_layers = int(num_mamba_layers)
        self.conv_shape = tuple(int(x) for x in conv_shape)
        self.ssm_shape = tuple(int(x) for x in ssm_shape)
        self.dtype = dtype
        self.ssm_dtype = ssm_dtype or dtype
        self.device = device
        n = self.size + 1  # slot 0: padding
        self.conv_state = torch.zeros((self.num_mamba_layers, n) + self.conv_shape, dtype=dtype, device=device)
        self.ssm_state = torch.zeros((self.num_mamba_layers, n) + self.ssm_shape, dtype=self.ssm_dtype, device=device)
        self._free: List[int] = list(range(1, n))

    # ---- slots --------------------------------------------------------------------------
    def available_size(self) -> int:
        return len(self._free)

    def alloc(self, need_size: int = 1) -> Optional[List[int]]:
        """`need_size` free slots (their state is whatever the last owner left: `clear_slot`
        them when a request starts from no cached prefix), or None when too few are free."""
        if need_size > len(self._free):
            return None
        out, self._free = self._free[:need_size], self._free[need_size:]
        return out

    def free(self, slots: SlotsLike) -> None:
        for s in _as_slot_list(slots):
            if not 1 <= s <= self.size:
                raise ValueError(f"MambaPool.free: slot {s} is not a valid slot (1..{self.size})")
            self._free.append(s)

    def clear(self) -> None:
        """Every slot free again (flush_cache)."""
        self._free = list(range(1, self.size + 1))

    def clear_slot(self, slots: SlotsLike) -> None:
        """Zero the states of `slots`: a request that starts from no cached prefix."""
        idx = torch.tensor(_as_slot_list(slots), dtype=torch.int64, device=self.device)
        self.conv_state[:, idx] = 0
        self.ssm_state[:, idx] = 0

    def copy_from(self, src_slots: SlotsLike, dst_slots: SlotsLike) -> None:
        """Copy the states of `src_slots` into `dst_slots` (copy-on-write of a cached prefix's
        state into the request's own slot)."""
        src = torch.tensor(_as_slot_list(src_slots), dtype=torch.int64, device=self.device)
        dst = torch.tensor(_as_slot_list(dst_slots), dtype=torch.int64, device=self.device)
        self.conv_state[:, dst] = self.conv_state[:, src]
        self.ssm_state[:, dst] = self.ssm_state[:, src]

    # ---- layer views (what a Mamba2 layer reads and writes) ------------------------------
    def layer_states(self, mamba_layer_idx: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(conv_state [size+1, conv_dim, d_conv-1], ssm_state [size+1, heads, head_dim, d_state])."""
        return self.conv_state[mamba_layer_idx], self.ssm_state[mamba_layer_idx]

    # ---- retraction backup (cpu_tensor) ------------------------------------------------------
    def get_cpu_copy(self, slot: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """A CPU copy of one slot's states in every layer."""
        return (self.conv_state[:, int(slot)].to("cpu", copy=True),
                self.ssm_state[:, int(slot)].to("cpu", copy=True))

    def load_cpu_copy(self, cpu_copy: Tuple[torch.Tensor, torch.Tensor], slot: int) -> None:
        conv, ssm = cpu_copy
        self.conv_state[:, int(slot)].copy_(conv)
        self.ssm_state[:, int(slot)].copy_(ssm)

    # ---- sizes and PD transfer ---------------------------------------------------------------
    @staticmethod
    def bytes_per_slot_for(num_mamba_layers: int, conv_shape, ssm_shape, dtype: torch.dtype,
                           ssm_dtype: Optional[torch.dtype] = None) -> int:
        conv = num_mamba_layers * _numel(conv_shape) * _elem(dtype)
        ssm = num_mamba_layers * _numel(ssm_shape) * _elem(ssm_dtype or dtype)
        return conv + ssm

    def bytes_per_slot(self) -> int:
        return self.bytes_per_slot_for(self.num_mamba_layers, self.conv_shape, self.ssm_shape, self.dtype, self.ssm_dtype)

    def get_state_size_bytes(self) -> int:
        return self.conv_state.nbytes + self.ssm_state.nbytes

    def state_tensors(self) -> List[torch.Tensor]:
        """One contiguous `[size + 1, ...]` tensor per (state kind, layer): conv states of all
        layers, then SSM states. Slot `s` is `t[s]`, `t[0].nbytes` bytes at `ptr + s * that`."""
        return [self.conv_state[i] for i in range(self.num_mamba_layers)] + \
               [self.ssm_state[i] for i in range(self.num_mamba_layers)]

    def state_item_lens(self) -> List[int]:
        """Bytes of one slot of each `state_tensors()` entry."""
        return [t[0].nbytes for t in self.state_tensors()]

    def get_contiguous_buf_infos(self) -> Tuple[List[int], List[int], List[int]]:
        """(data_ptrs, data_lens, item_lens) of `state_tensors()`, for transfer-engine registration."""
        ts = self.state_tensors()
        return [t.data_ptr() for t in ts], [t.nbytes for t in ts], [t[0].nbytes for t in ts]


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= int(x)
    return n


def _elem(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def resolve_mamba_ssm_dtype(name: Optional[str], hf_config: Any, model_dtype: torch.dtype,
                            model_default: Optional[torch.dtype] = None) -> torch.dtype:
    """--mamba-ssm-dtype when given, else the checkpoint's `mamba_ssm_cache_dtype`, else the
    model's own default (`model_default`: gated-DeltaNet models keep float32 states, as HF), else
    the model dtype."""
    if name is None:
        name = getattr(hf_config, "mamba_ssm_cache_dtype", None)
        if isinstance(name, torch.dtype):
            return name
    if name is None or name == "auto":
        return model_default or model_dtype
    if name not in _SSM_DTYPES:
        raise ValueError(f"--mamba-ssm-dtype {name!r} is not supported; choose one of {sorted(_SSM_DTYPES)}")
    return _SSM_DTYPES[name]


def mamba_cache_size(max_mamba_cache_size: Optional[int], max_running_requests: Optional[int],
                     state_prefix_caching: bool, memory_budget_bytes: int, bytes_per_slot: int,
                     mamba_full_memory_ratio: Optional[float] = None) -> int:
    """Number of MambaPool slots (see the module docstring)."""
    if max_mamba_cache_size is not None:
        return int(max_mamba_cache_size)
    if not state_prefix_caching:
        return int(max_running_requests) if max_running_requests is not None else DEFAULT_MAX_MAMBA_CACHE_SIZE
    ratio = MAMBA_FULL_MEMORY_RATIO_FALLBACK if mamba_full_memory_ratio is None else float(mamba_full_memory_ratio)
    mamba_bytes = memory_budget_bytes * ratio / (1 + ratio)
    return int(mamba_bytes // bytes_per_slot)
