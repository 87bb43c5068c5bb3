"""Shared builders for the Triton attention tests: a random paged KV pool with scattered pages."""

from __future__ import annotations

import os

import torch


def fresh_seed() -> int:
    """A new seed every run (torch's default generator starts from the same seed in every
    process); printed so that a failure can be replayed."""
    seed = int.from_bytes(os.urandom(4), "little") % (2**31 - 1)
    print(f"random seed {seed}")
    return seed


def fresh_generator() -> torch.Generator:
    return torch.Generator().manual_seed(fresh_seed())


def scattered_slots(seq_lens, page_size, gen, pad_pages=1):
    """Token slots per request: whole pages taken in random order, page 0 left as padding."""
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    total_pages = sum(pages_per_req) + 3  # a few never-used pages
    order = torch.randperm(total_pages, generator=gen) + pad_pages
    slots, cursor = [], 0
    for n, k in zip(seq_lens, pages_per_req):
        pages = order[cursor : cursor + k]
        cursor += k
        s = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
        slots.append(s)
    num_slots = (total_pages + pad_pages) * page_size
    return slots, num_slots


def random_pool(seq_lens, page_size, kv_heads, head_dim, dtype, gen, v_head_dim=None):
    """(req_to_token, req_pool_indices, k_buffer, v_buffer, slots): rows placed at random req slots."""
    v_head_dim = v_head_dim or head_dim
    slots, num_slots = scattered_slots(seq_lens, page_size, gen)
    bs = len(seq_lens)
    max_ctx = max(seq_lens) + 5
    req_to_token = torch.zeros((bs + 3, max_ctx), dtype=torch.int64)
    req_pool_indices = torch.randperm(bs + 3, generator=gen)[:bs]
    for i, s in enumerate(slots):
        req_to_token[req_pool_indices[i], : len(s)] = s
    k_buffer = torch.randn((num_slots, kv_heads, head_dim), generator=gen).to(dtype)
    v_buffer = torch.randn((num_slots, kv_heads, v_head_dim), generator=gen).to(dtype)
    return req_to_token, req_pool_indices, k_buffer, v_buffer, slots


def tolerance(dtype):
    if dtype == torch.float32:
        return dict(atol=2e-3, rtol=2e-3)
    if dtype == torch.bfloat16:
        return dict(atol=4e-2, rtol=4e-2)
    return dict(atol=2e-2, rtol=2e-2)
