"""Stand-in for upstream SGLang's `sgl_kernel` in the benchmark-only upstream-SGLang venv.

Why: upstream SGLang's CPU route imports two C++ ops from `sgl_kernel`, whose CPU build is not on
the package index (it must be built from source). These plain-torch versions have the same
signatures and effects, so that upstream's `--device cpu` path can run for a side-by-side
measurement. (Without AMX upstream uses its torch-native attention/GEMM paths anyway; these two
ops only move indices and KV rows.) Copied to site-packages/sgl_kernel by setup_peers.sh.
"""

import ctypes

import torch

__version__ = "0.0.0+benchmark-standin"


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = the next (end - start) slots of out_cache_loc."""
    starts, ends = start_offset.tolist(), end_offset.tolist()
    pos = 0
    for i, row in enumerate(req_pool_indices.tolist()):
        n = ends[i] - starts[i]
        req_to_token[row, starts[i]:ends[i]] = out_cache_loc[pos:pos + n].to(req_to_token.dtype)
        pos += n


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every KV buffer (raw pointer, bytes per token row): row tgt_loc[j] = row src_loc[j]."""
    srcs, tgts = src_loc.tolist(), tgt_loc.tolist()
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for s, t in zip(srcs, tgts):
            ctypes.memmove(ptr + t * stride, ptr + s * stride, stride)


def __getattr__(name):
    """Any other sgl_kernel name imports (upstream imports many at module level on CPU) but raises
    when called, so a path that would need a real C++ op fails loudly instead of silently."""
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not in the benchmark stand-in")

    missing.__name__ = name
    return missing
