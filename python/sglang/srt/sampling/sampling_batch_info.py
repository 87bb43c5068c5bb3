"""Batched sampling state for one forward step: what `Sampler.forward` needs besides the logits.

Built from the running requests with `SamplingBatchInfo.from_reqs` (upstream builds it from the
ScheduleBatch and updates it incrementally; rebuilding it from the requests each step keeps it
always consistent with the requests and costs a few vectorized scatters, see `penalties.py`).

A request only has to expose:
- `sampling_params`: a `SamplingParams` (already normalized/verified),
- `origin_input_ids`: list[int] (the prompt) and `output_ids`: list[int] (generated so far),
- optionally `eos_token_ids`: set[int] (the model's EOS ids; `from_reqs(eos_token_ids=...)` gives a
  batch-wide default that is merged with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import torch

from sglang.srt.sampling import penalties

_MASK32 = 0xFFFFFFFF


@dataclass
class SamplingBatchInfo:
    # Per-request sampling knobs.
    temperatures: torch.Tensor  # [B, 1] float32 (greedy rows hold 1.0)
    top_ps: torch.Tensor  # [B] float32
    top_ks: torch.Tensor  # [B] int64, clamped to vocab_size (1 = greedy)
    min_ps: torch.Tensor  # [B] float32
    is_all_greedy: bool
    need_top_p_sampling: bool
    need_top_k_sampling: bool
    need_min_p_sampling: bool
    vocab_size: int
    device: torch.device
    # Seeded rows sample from a hash of (seed, position, token id): reproducible and independent
    # of whatever else is in the batch.
    has_seed: torch.Tensor  # [B] bool
    seed_lo: torch.Tensor  # [B] int64: low 32 bits of sampling_seed (0 when unseeded)
    seed_hi: torch.Tensor  # [B] int64: high 32 bits of sampling_seed
    positions: torch.Tensor  # [B] int64: index of the token being sampled (prompt + outputs)
    # Penalty inputs (kept for inspection) and the tensors applied to the logits.
    frequency_penalties: torch.Tensor  # [B] float32
    presence_penalties: torch.Tensor  # [B] float32
    repetition_penalties: torch.Tensor  # [B] float32
    linear_penalties: Optional[torch.Tensor] = None  # [B, V] added (frequency + presence)
    scaling_penalties: Optional[torch.Tensor] = None  # [B, V] repetition scale (1 = untouched)
    min_new_tokens_mask: Optional[torch.Tensor] = None  # [B, V] bool, True -> logit = -inf
    logit_bias: Optional[torch.Tensor] = None  # [B, V] added
    # Grammar-constrained decoding (upstream's pair): the grammar backend's batch mask and the
    # function that applies it to the logits (xgrammar: a packed int32 bitmask, 1 bit = allowed).
    vocab_mask: Optional[torch.Tensor] = None
    apply_mask_func: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None
    # --enable-custom-logit-processor: runs the requests' processors on the logits, in place, last.
    apply_custom_logit_processors: Optional[Callable[[torch.Tensor], None]] = None

    @property
    def batch_size(self) -> int:
        return int(self.top_ks.shape[0])

    @property
    def greedy_mask(self) -> torch.Tensor:
        """[B] bool: rows decoded greedily (top_k == 1)."""
        return self.top_ks <= 1

    @property
    def has_penalties(self) -> bool:
        return any(
            t is not None
            for t in (self.linear_penalties, self.scaling_penalties, self.min_new_tokens_mask,
                      self.logit_bias, self.vocab_mask)
        )

    @property
    def modifies_logits(self) -> bool:
        """Whether `apply_logits_bias` writes to the logits (the sampler then works on a copy)."""
        return self.has_penalties or self.apply_custom_logit_processors is not None

    @classmethod
    def from_reqs(
        cls,
        reqs: Sequence,
        vocab_size: int,
        device="cpu",
        eos_token_ids: Optional[Iterable[int]] = None,
        repetition_penalty_include_prompt: bool = True,
    ) -> "SamplingBatchInfo":
        """Builds the batch's sampling tensors from its requests (see the module docstring).

        `repetition_penalty_include_prompt`: the repetition penalty scales every token seen in
        the prompt or the output (HF `RepetitionPenaltyLogitsProcessor` semantics, which sees
        the whole input_ids); False restricts it to generated tokens.
        """
        device = torch.device(device)
        sps = [r.sampling_params for r in reqs]
        default_eos = set(eos_token_ids or ())

        def f32(values):
            return torch.tensor(values, dtype=torch.float32, device=device)

        temperatures = f32([sp.temperature for sp in sps]).view(-1, 1)
        top_ps = f32([sp.top_p for sp in sps])
        top_k_list = [min(int(sp.top_k), vocab_size) for sp in sps]
        top_ks = torch.tensor(top_k_list, dtype=torch.int64, device=device)
        min_ps = f32([sp.min_p for sp in sps])

        seeds = [sp.sampling_seed for sp in sps]
        has_seed = torch.tensor([s is not None for s in seeds], dtype=torch.bool, device=device)
        seed_lo = torch.tensor([(int(s) & _MASK32) if s is not None else 0 for s in seeds],
                               dtype=torch.int64, device=device)
        seed_hi = torch.tensor([((int(s) >> 32) & _MASK32) if s is not None else 0 for s in seeds],
                               dtype=torch.int64, device=device)
        positions = torch.tensor([len(r.origin_input_ids) + len(r.output_ids) for r in reqs],
                                 dtype=torch.int64, device=device)

        freq = f32([sp.frequency_penalty for sp in sps])
        pres = f32([sp.presence_penalty for sp in sps])
        rep = f32([sp.repetition_penalty for sp in sps])

        linear = None
        if any(sp.frequency_penalty != 0.0 or sp.presence_penalty != 0.0 for sp in sps):
            counts = penalties.token_counts([r.output_ids for r in reqs], vocab_size, device)
            linear = penalties.linear_penalties(counts, freq, pres)

        scaling = None
        if any(sp.repetition_penalty != 1.0 for sp in sps):
            seen = [
                (list(r.origin_input_ids) + list(r.output_ids))
                if repetition_penalty_include_prompt else r.output_ids
                for r in reqs
            ]
            scaling = penalties.repetition_scaling(seen, rep, vocab_size, device)

        min_tokens_mask = None
        if any(sp.min_new_tokens > 0 for sp in sps):
            banned, still = [], []
            for r, sp in zip(reqs, sps):
                ids = set(default_eos)
                ids |= set(r.eos_token_ids or ())
                ids |= set(sp.stop_token_ids or ())
                banned.append(sorted(ids))
                still.append(len(r.output_ids) < sp.min_new_tokens)
            min_tokens_mask = penalties.min_new_tokens_mask(banned, still, vocab_size, device)

        logit_bias = None
        if any(sp.logit_bias for sp in sps):
            logit_bias = torch.zeros(len(reqs), vocab_size, dtype=torch.float32, device=device)
            for i, sp in enumerate(sps):
                if sp.logit_bias:
                    ids = torch.tensor([int(k) for k in sp.logit_bias], dtype=torch.int64,
                                       device=device)
                    logit_bias[i, ids] = f32([float(v) for v in sp.logit_bias.values()])

        return cls(
            temperatures=temperatures,
            top_ps=top_ps,
            top_ks=top_ks,
            min_ps=min_ps,
            is_all_greedy=all(k <= 1 for k in top_k_list),
            need_top_p_sampling=any(sp.top_p != 1.0 for sp in sps),
            need_top_k_sampling=any(1 < k < vocab_size for k in top_k_list),
            need_min_p_sampling=any(sp.min_p > 0 for sp in sps),
            vocab_size=vocab_size,
            device=device,
            has_seed=has_seed,
            seed_lo=seed_lo,
            seed_hi=seed_hi,
            positions=positions,
            frequency_penalties=freq,
            presence_penalties=pres,
            repetition_penalties=rep,
            linear_penalties=linear,
            scaling_penalties=scaling,
            min_new_tokens_mask=min_tokens_mask,
            logit_bias=logit_bias,
        )

    def apply_logits_bias(self, logits: torch.Tensor) -> None:
        """Applies, in place on [B, V] logits: repetition scaling, frequency/presence penalties,
        the min_new_tokens ban, the grammar mask, logit_bias (upstream's order: penalties,
        vocab mask, logit_bias), then custom logit processors (upstream: first step of its sampler)."""
        width = logits.shape[-1]
        if self.scaling_penalties is not None:
            penalties.apply_scaling_penalties(logits, _fit(self.scaling_penalties, width, 1.0))
        if self.linear_penalties is not None:
            logits.add_(_fit(self.linear_penalties, width, 0.0))
        if self.min_new_tokens_mask is not None:
            logits.masked_fill_(_fit(self.min_new_tokens_mask, width, False), float("-inf"))
        if self.vocab_mask is not None:
            self.apply_mask_func(logits, self.vocab_mask)
        if self.logit_bias is not None:
            logits.add_(_fit(self.logit_bias, width, 0.0))
        if self.apply_custom_logit_processors is not None:
            self.apply_custom_logit_processors(logits)


def _fit(t: torch.Tensor, width: int, pad_value) -> torch.Tensor:
    """Pads/crops a [B, vocab_size] tensor to the logits' width (padded vocabularies)."""
    if t.shape[-1] == width:
        return t
    if t.shape[-1] > width:
        return t[:, :width]
    pad = torch.full((t.shape[0], width - t.shape[-1]), pad_value, dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], dim=-1)

