"""GGUF files for tests, written with gguf-py's `GGUFWriter` (no llama.cpp needed).

`write_tiny_llama_gguf(path, types)`: a tiny random llama in a GGUF file whose linear weights have
the given ggml types per projection. Types gguf-py can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
F16, BF16) are quantized from random floats; for the K-quants (Q2_K-Q6_K, which gguf-py only
dequantizes) the blocks are random bytes with small fp16 scales, which are valid blocks in
llama.cpp's published layouts: the reference dequantizes the same bytes.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

K_QUANT_SCALE_BYTES = {  # byte offsets of the fp16 super-block scales (d, and dmin where there is one)
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}


def random_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """uint8 [rows, bytes per row]: `rows` x `cols` values of `type_name` (random weights ~ `scale`)."""
    import gguf.quants as gq
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    t = GGMLQuantizationType[type_name]
    if type_name not in K_QUANT_SCALE_BYTES:
        w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        return w.view(np.uint8) if type_name == "F32" else np.ascontiguousarray(gq.quantize(w, t)).view(np.uint8)
    block_values, block_bytes = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, (rows, cols // block_values, block_bytes), dtype=np.uint8)
    for off in K_QUANT_SCALE_BYTES[type_name]:
        halves = (rng.random((rows, cols // block_values)) * scale / 8 + scale / 64).astype(np.float16)
        raw[..., off:off + 2] = halves.view(np.uint8).reshape(rows, cols // block_values, 2)
    return raw.reshape(rows, -1)


def write_tiny_llama_gguf(path: str, types: Dict[str, str], hidden: int = 256, intermediate: int = 512,
                          layers: int = 2, heads: int = 4, kv_heads: int = 2, vocab: int = 512, seed: int = 0,
                          embed_type: str = "Q8_0", output_type: Optional[str] = "Q6_K") -> str:
    """`types`: ggml type name per projection ("attn_q", "attn_k", "attn_v", "attn_output",
    "ffn_gate", "ffn_up", "ffn_down"; "Q4_0" where absent). output_type None: a tied LM head."""
    from gguf import GGMLQuantizationType, GGUFWriter

    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(intermediate)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)

    def quantized(name: str, type_name: str, rows: int, cols: int, scale: float = 0.02):
        w.add_tensor(name, random_blocks(type_name, rows, cols, rng, scale),
                     raw_dtype=GGMLQuantizationType[type_name])

    def norm(name: str, size: int):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32))

    quantized("token_embd.weight", embed_type, vocab, hidden, scale=1.0)
    head = heads * (hidden // heads)
    kv = kv_heads * (hidden // heads)
    shapes = {"attn_q": (head, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden), "attn_output": (hidden, head),
              "ffn_gate": (intermediate, hidden), "ffn_up": (intermediate, hidden), "ffn_down": (hidden, intermediate)}
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight", hidden)
        norm(f"blk.{i}.ffn_norm.weight", hidden)
        for proj, (rows, cols) in shapes.items():
            quantized(f"blk.{i}.{proj}.weight", types.get(proj, "Q4_0"), rows, cols, scale=0.5 / np.sqrt(cols))
    norm("output_norm.weight", hidden)
    if output_type is not None:
        quantized("output.weight", output_type, vocab, hidden, scale=0.5 / np.sqrt(hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
