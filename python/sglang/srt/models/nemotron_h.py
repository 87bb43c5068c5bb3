"""NemotronH (NVIDIA Nemotron-H / Nemotron-Nano-v2): a stack of single-mixer blocks, each
`h = h + mixer(RMSNorm(h))`, where the mixer is chosen per layer by the config's pattern:

    'M' Mamba2 (linear_attention)   '*' attention (full_attention, no rotary embedding)
    '-' MLP (up/down, relu2)         'E' MoE (DeepSeek-V3 routing, non-gated experts, shared experts)

The pattern is `hybrid_override_pattern` in NVIDIA's configs; transformers 5 writes it as
`layers_block_type` (["linear_attention", "full_attention", "mlp", "moe"]); both are read.
Checkpoints name the body `backbone.` (HF in memory: `model.`); both load. The LM head is never
tied to the embedding (HF NemotronH declares no tied weights).

Only attention layers own KV (`ModelConfig.attention_layer_ids`); the Mamba2 layers keep their
state in the runner's `MambaPool` (see `mamba_layer_ids` / `mamba_state_shapes`).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, List, Optional, Tuple

import torch
from torch import nn

from sglang.srt.layers.linear import QKVParallelLinear, ReplicatedLinear, default_weight_loader
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.mamba.mamba_mixer2 import Mamba2Metadata, MambaMixer2
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_loader.weight_loading import expected_weight_keys, load_weights_into

_TYPE_TO_CHAR = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*",
                 "mlp": "-", "moe": "E"}


def nemotron_h_pattern(config: Any) -> str:
    """The per-layer pattern ('M', '*', '-', 'E') from an HF config object or dict."""
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    types = get("layers_block_type", None)
    if types:
        try:
            return "".join(_TYPE_TO_CHAR[t] for t in types)
        except KeyError as e:
            raise ValueError(f"NemotronH: unknown layer type {e.args[0]!r} in layers_block_type") from None
    pattern = get("hybrid_override_pattern", None)
    if pattern:
        return str(pattern)
    raise ValueError("NemotronH config has neither `layers_block_type` nor `hybrid_override_pattern`")


class NemotronHRMSNorm(nn.Module):
    """RMSNorm with the weight multiplied in fp32 before the cast back (HF NemotronHRMSNorm)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * h).to(x.dtype)


def _relu2(x: torch.Tensor) -> torch.Tensor:
    return torch.square(torch.relu(x))


_MLP_ACTS = {"relu2": _relu2, "relu": torch.relu, "silu": nn.functional.silu,
             "gelu": nn.functional.gelu}


class NemotronHMLP(nn.Module):
    def __init__(self, config: Any, intermediate_size: Optional[int] = None):
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        act = getattr(config, "mlp_hidden_act", "relu2")
        if act not in _MLP_ACTS:
            raise NotImplementedError(f"NemotronH mlp_hidden_act {act!r} is not supported")
        self.act = _MLP_ACTS[act]
        inter = intermediate_size or config.intermediate_size
        self.up_proj = ReplicatedLinear(config.hidden_size, inter, bias=bias)
        self.down_proj = ReplicatedLinear(inter, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, forward_batch=None, meta=None) -> torch.Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


class NemotronHTopkRouter(nn.Module):
    """DeepSeek-V3 style routing, in fp32 as HF: sigmoid scores; experts chosen by score +
    `e_score_correction_bias` within the `topk_group` best of `n_group` groups (a group's score
    is the sum of its top two); weights are the plain scores, renormalised when
    `norm_topk_prob`, times `routed_scaling_factor`."""

    def __init__(self, config: Any):
        super().__init__()
        self.num_experts = config.n_routed_experts
        self.top_k = config.num_experts_per_tok
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.norm_topk_prob = bool(config.norm_topk_prob)
        self.routed_scaling_factor = float(config.routed_scaling_factor)
        if self.num_experts % self.n_group:
            raise ValueError(f"NemotronH: n_routed_experts ({self.num_experts}) must divide into n_group ({self.n_group})")
        self.weight = nn.Parameter(torch.empty(self.num_experts, config.hidden_size, dtype=torch.float32),
                                   requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(torch.empty(self.num_experts, dtype=torch.float32),
                                                    requires_grad=False)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        scores = torch.sigmoid(nn.functional.linear(x.float(), self.weight.float()))
        choice = scores + self.e_score_correction_bias.float()
        grouped = choice.view(-1, self.n_group, self.num_experts // self.n_group)
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(-1)
        group_idx = group_scores.topk(self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0).bool()
        expert_mask = group_mask[:, :, None].expand_as(grouped).reshape(-1, self.num_experts)
        idx = choice.masked_fill(~expert_mask, float("-inf")).topk(self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.routed_scaling_factor, idx


class NemotronHExperts(nn.Module):
    """Non-gated expert MLPs `down(act(up(x)))`, stacked: up [E, I, D], down [E, D, I]. Checkpoints
    store them one by one (`experts.{e}.up_proj.weight`); `load_expert` fills slice e."""

    def __init__(self, config: Any, in_dim: int):
        super().__init__()
        self.num_experts = config.n_routed_experts
        inter = config.moe_intermediate_size
        self.up_proj = nn.Parameter(torch.empty(self.num_experts, inter, in_dim), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, in_dim, inter), requires_grad=False)
        self.act = _MLP_ACTS[getattr(config, "mlp_hidden_act", "relu2")]

    def forward(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape, dtype=weights.dtype, device=x.device)
        for e in torch.unique(idx).tolist():
            tok, k = torch.where(idx == e)
            h = self.act(nn.functional.linear(x[tok], self.up_proj[e]))
            h = nn.functional.linear(h, self.down_proj[e]) * weights[tok, k, None]
            out.index_add_(0, tok, h.to(out.dtype))
        return out.to(x.dtype)


class NemotronHMoE(nn.Module):
    """Routed experts (optionally in a smaller latent space) plus always-on shared experts."""

    def __init__(self, config: Any):
        super().__init__()
        latent = getattr(config, "moe_latent_size", None)
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate = NemotronHTopkRouter(config)
        self.experts = NemotronHExperts(config, latent or config.hidden_size)
        self.shared_experts = NemotronHMLP(config, config.moe_shared_expert_intermediate_size)
        self.fc1_latent_proj = ReplicatedLinear(config.hidden_size, latent, bias=bias) if latent else None
        self.fc2_latent_proj = ReplicatedLinear(latent, config.hidden_size, bias=bias) if latent else None

    def forward(self, x: torch.Tensor, forward_batch=None, meta=None) -> torch.Tensor:
        weights, idx = self.gate(x)
        h = self.fc1_latent_proj(x) if self.fc1_latent_proj is not None else x
        h = self.experts(h, weights, idx)
        if self.fc2_latent_proj is not None:
            h = self.fc2_latent_proj(h)
        return h + self.shared_experts(x)


class NemotronHAttention(nn.Module):
    """Plain GQA attention: no rotary embedding (NemotronH's position signal comes from Mamba)."""

    def __init__(self, config: Any, layer_id: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads, bias=bias)
        self.o_proj = ReplicatedLinear(self.q_size, config.hidden_size, bias=bias)
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim ** -0.5, self.num_kv_heads,
                                   layer_id=layer_id)

    def forward(self, x: torch.Tensor, forward_batch, meta=None) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return self.o_proj(self.attn(q.contiguous(), k.contiguous(), v.contiguous(), forward_batch))


def _mamba_mixer(config: Any, mamba_layer_idx: int) -> MambaMixer2:
    n_heads, head_dim = config.mamba_num_heads, config.mamba_head_dim
    return MambaMixer2(
        hidden_size=config.hidden_size,
        num_heads=n_heads,
        head_dim=head_dim,
        ssm_state_size=config.ssm_state_size,
        conv_kernel_size=config.conv_kernel,
        n_groups=config.n_groups,
        mamba_layer_idx=mamba_layer_idx,
        chunk_size=config.chunk_size,
        use_conv_bias=bool(config.use_conv_bias),
        in_proj_bias=bool(getattr(config, "use_bias", False)),
        out_proj_bias=bool(getattr(config, "use_bias", False)),
        activation=getattr(config, "mamba_hidden_act", "silu"),
        rms_norm=True,
        norm_before_gate=False,
        norm_eps=config.layer_norm_epsilon,
        # HF NemotronH: the scan clamps dt to (time_step_min, inf); the decode step does not.
        prefill_dt_limit=(float(getattr(config, "time_step_min", 0.0)), float("inf")),
        decode_dt_limit=None,
    )


class NemotronHBlock(nn.Module):
    def __init__(self, config: Any, layer_id: int, kind: str, mamba_layer_idx: int):
        super().__init__()
        self.kind = kind
        self.norm = NemotronHRMSNorm(config.hidden_size, config.layer_norm_epsilon)
        if kind == "M":
            self.mixer = _mamba_mixer(config, mamba_layer_idx)
        elif kind == "*":
            self.mixer = NemotronHAttention(config, layer_id)
        elif kind == "-":
            self.mixer = NemotronHMLP(config)
        elif kind == "E":
            self.mixer = NemotronHMoE(config)
        else:
            raise ValueError(f"NemotronH: unknown block type {kind!r} at layer {layer_id}")

    def forward(self, hidden_states: torch.Tensor, forward_batch, meta) -> torch.Tensor:
        residual = hidden_states
        return residual + self.mixer(self.norm(hidden_states), forward_batch, meta)


class NemotronHModel(nn.Module):
    def __init__(self, config: Any, pattern: str):
        super().__init__()
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        blocks, m = [], 0
        for i, kind in enumerate(pattern):
            blocks.append(NemotronHBlock(config, i, kind, m))
            m += kind == "M"
        self.layers = nn.ModuleList(blocks)
        self.norm_f = NemotronHRMSNorm(config.hidden_size, config.layer_norm_epsilon)

    def forward(self, input_ids, positions, forward_batch, input_embeds=None) -> torch.Tensor:
        h = self.embeddings(input_ids) if input_embeds is None else input_embeds
        meta = Mamba2Metadata.from_forward_batch(forward_batch) if any(b.kind == "M" for b in self.layers) else None
        for block in self.layers:
            h = block(h, forward_batch, meta)
        return self.norm_f(h)


class NemotronHForCausalLM(nn.Module):
    stacked_params_mapping: List[Tuple[str, str, Any]] = [
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
    ]

    def __init__(self, config: Any, model_config=None):
        super().__init__()
        self.config = config
        self.model_config = model_config
        self.pattern = nemotron_h_pattern(config)
        self.backbone = NemotronHModel(config, self.pattern)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor(config)
        self.mamba_layer_ids = [i for i, c in enumerate(self.pattern) if c == "M"]

    def mamba_state_shapes(self):
        """(conv_state shape, ssm_state shape) of one slot of one Mamba2 layer."""
        mixer = self.backbone.layers[self.mamba_layer_ids[0]].mixer
        return mixer.conv_state_shape, mixer.ssm_state_shape

    def forward(self, input_ids, positions, forward_batch, input_embeds=None) -> LogitsProcessorOutput:
        h = self.backbone(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, h, self.lm_head, forward_batch)

    @staticmethod
    def _canonical(name: str) -> Optional[str]:
        if name.startswith("mtp.") or ".mtp." in name:
            return None  # multi-token-prediction head: not used
        if name.startswith("model."):
            name = "backbone." + name[len("model."):]
        return name

    def _load_experts(self, params: dict, name: str, tensor: torch.Tensor) -> Optional[List[str]]:
        """Expert weights: one expert's into its slice, or HF's in-memory [E, ...] tensor whole."""
        expert = _EXPERT_WEIGHT.match(name)
        if expert is not None:  # one expert of a stacked [E, ...] parameter
            target = f"{expert.group(1)}experts.{expert.group(3)}"
            e = int(expert.group(2))
            param = params.get(target)
            if param is None:
                return None
            default_weight_loader_slice(param, e, tensor)
            return [f"{target}:{e}"]
        if ".experts." in name:
            param = params.get(name)
            if param is None:
                return None
            default_weight_loader(param, tensor)
            return [f"{name}:{e}" for e in range(tensor.shape[0])]
        return None

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> set:
        params = dict(self.named_parameters())
        return load_weights_into(self, weights, self.stacked_params_mapping, canonical=self._canonical,
                                 special=lambda name, tensor: self._load_experts(params, name, tensor))

    def expected_weight_keys(self) -> set:
        out = expected_weight_keys(self, skip=lambda name: ".experts." in name)
        for name, p in self.named_parameters():
            if ".experts." in name:
                out.update(f"{name}:{e}" for e in range(p.shape[0]))
        return out


# backbone.layers.3.mixer.experts.7.up_proj.weight -> ("backbone.layers.3.mixer.", "7", "up_proj")
_EXPERT_WEIGHT = re.compile(r"^(.*\.)experts\.(\d+)\.(up_proj|down_proj)\.weight$")


def default_weight_loader_slice(param: nn.Parameter, index: int, tensor: torch.Tensor) -> None:
    """Copy one expert's weight into slice `index` of a stacked [E, ...] parameter."""
    dst = param.data[index]
    if tuple(dst.shape) != tuple(tensor.shape):
        raise ValueError(f"Weight shape mismatch: parameter {tuple(dst.shape)} vs checkpoint {tuple(tensor.shape)}")
    dst.copy_(tensor.to(dtype=dst.dtype, device=dst.device))


EntryClass = NemotronHForCausalLM
