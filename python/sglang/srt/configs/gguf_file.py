"""A GGUF file (llama.cpp's format) as a model source: its header read once, the HF config its
metadata describes, and where each tensor's bytes lie.

The reader is this module's own (about 0.1 s for the default model): gguf-py's `GGUFReader`
parses every metadata array into Python objects and takes ~5 s on the same file, which each
server process would pay. Tensor bytes are not read here: `tensors` gives their offsets into the
file, which the weight loader (model_loader/gguf_loader.py) maps.

Architectures: llama (also Mistral and SmolLM files, which llama.cpp writes as llama), qwen2 and
qwen3; any other stops the server at start with one line naming the architecture.
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np

GGUF_MAGIC = b"GGUF"

# ggml's type ids and (values per block, bytes per block) for the types sgl-kernel multiplies.
GGML_TYPES: Dict[int, Tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}
FLOAT_TYPES = {0: np.float32, 1: np.float16}  # BF16 (30) is read as uint16 and widened

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# GGUF metadata value types: struct format of the scalars (8: string, 9: array).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class GGUFError(ValueError):
    """A GGUF file the server cannot serve; the message is one line naming the file and the field."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: Tuple[int, ...]  # ggml order: shape[0] is the row length (values per row)
    ggml_type: int
    offset: int  # absolute, in the file

    @property
    def type_name(self) -> str:
        if self.ggml_type in GGML_TYPES:
            return GGML_TYPES[self.ggml_type][0]
        try:  # a type this server does not multiply: its name, where gguf-py knows it
            from gguf import GGMLQuantizationType

            return GGMLQuantizationType(self.ggml_type).name
        except (ImportError, ValueError):
            return f"ggml type {self.ggml_type}"

    def row_values(self) -> int:
        return self.shape[0]

    def rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n

    def nbytes(self) -> int:
        _, values, size = GGML_TYPES[self.ggml_type]
        return self.rows() * (self.row_values() // values) * size


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    metadata: Dict[str, Any]
    tensors: Tuple[GGUFTensorInfo, ...]


def is_gguf_file(path: Any) -> bool:
    """Whether `path` is a file that starts with the GGUF magic."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


class _Cursor:
    def __init__(self, data: bytes, path: str):
        self.data, self.pos, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise GGUFError(f"GGUF file {self.path} is truncated (header ends at byte {len(self.data)})")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if etype in _SCALARS:
                size = struct.calcsize(_SCALARS[etype])
                return np.frombuffer(self.take(size * count), dtype=np.dtype(_SCALARS[etype])).tolist()
            return [self.value(etype) for _ in range(count)]
        raise GGUFError(f"GGUF file {self.path}: unknown metadata value type {vtype}")


@functools.lru_cache(maxsize=8)
def read_header(path: str) -> GGUFHeader:
    """The metadata and the tensor table of a GGUF file (versions 2 and 3)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        data = f.read(min(size, 64 << 20))  # headers hold the vocabulary: a few MB
    cur = _Cursor(data, path)
    if cur.take(4) != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (no GGUF magic)")
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise GGUFError(f"GGUF file {path} has version {version}; versions 2 and 3 are supported")
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    metadata: Dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    entries = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.scalar("<Q") for _ in range(cur.scalar("<I")))
        entries.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
    align = int(metadata.get("general.alignment", 32))
    start = (cur.pos + align - 1) // align * align
    tensors = tuple(GGUFTensorInfo(n, d, t, start + o) for n, d, t, o in entries)
    for t in tensors:
        if t.ggml_type not in GGML_TYPES:
            raise GGUFError(f"GGUF tensor {t.name} has type {t.type_name}, which is not supported "
                            f"(supported: {', '.join(v[0] for v in GGML_TYPES.values())})")
        if t.row_values() % GGML_TYPES[t.ggml_type][1]:
            raise GGUFError(f"GGUF tensor {t.name}: {t.row_values()} values per row is not a whole number of "
                            f"{t.type_name} blocks")
        if t.offset + t.nbytes() > size:
            raise GGUFError(f"GGUF file {path} is truncated: tensor {t.name} ends at byte "
                            f"{t.offset + t.nbytes()}, the file has {size}")
    return GGUFHeader(path, metadata, tensors)


@functools.lru_cache(maxsize=8)
def gguf_config_dict(path: str) -> Dict[str, Any]:
    """The HF config (as config.json would hold it) that the file's metadata describes."""
    md = read_header(path).metadata
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"GGUF file {path} has architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")

    def field(key: str, default: Any = None, required: bool = True):
        full = f"{arch}.{key}"
        if full not in md:
            if required and default is None:
                raise GGUFError(f"GGUF file {path} lacks the metadata field {full}")
            return default
        return md[full]

    scaling = md.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise GGUFError(f"GGUF file {path}: {arch}.rope.scaling.type {scaling!r} is not supported")
    hidden, n_head = int(field("embedding_length")), int(field("attention.head_count"))
    n_kv = field("attention.head_count_kv", n_head)
    tokens = md.get("tokenizer.ggml.tokens")
    names = {t.name for t in read_header(path).tensors}
    cfg: Dict[str, Any] = dict(
        architectures=[ARCHITECTURES[arch]],
        model_type=arch,
        hidden_size=hidden,
        intermediate_size=int(field("feed_forward_length")),
        num_hidden_layers=int(field("block_count")),
        num_attention_heads=n_head,
        num_key_value_heads=int(n_kv if not isinstance(n_kv, list) else n_kv[0]),
        head_dim=int(field("attention.key_length", hidden // n_head)),
        max_position_embeddings=int(field("context_length", 2048)),
        rms_norm_eps=float(field("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(field("rope.freq_base", 10000.0)),
        vocab_size=int(field("vocab_size", len(tokens) if tokens else None)),
        tie_word_embeddings="output.weight" not in names,
        hidden_act="silu",
        torch_dtype="float32",
    )
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        if f"tokenizer.ggml.{name}_token_id" in md:
            cfg[key] = int(md[f"tokenizer.ggml.{name}_token_id"])
    if arch == "llama":
        cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    return cfg


def split_gguf_path(path: str) -> Tuple[str, str]:
    """(folder, file name): how transformers' `from_pretrained(folder, gguf_file=name)` takes it."""
    path = os.path.abspath(path)
    return os.path.dirname(path), os.path.basename(path)


def tensor_names(path: str) -> List[str]:
    return [t.name for t in read_header(path).tensors]
