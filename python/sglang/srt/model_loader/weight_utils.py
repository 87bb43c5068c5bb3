"""Reading checkpoint tensors from a model folder: `*.safetensors`, sharded (with
`model.safetensors.index.json`) or not, with upstream's progress bar."""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator, List, Tuple

import torch

# Upstream's tqdm format for weight loading.
BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"


def list_safetensors_files(model_path: str) -> List[str]:
    index = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted({os.path.join(model_path, v) for v in weight_map.values()})
        missing = [p for p in files if not os.path.exists(p)]
        if missing:
            raise FileNotFoundError(f"Checkpoint shards listed in {index} are missing: {missing}")
        return files
    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"Cannot find any model weights (*.safetensors) in {model_path}")
    return files


def safetensors_weights_iterator(files: List[str], show_progress: bool = True) -> Iterator[Tuple[str, torch.Tensor]]:
    from safetensors import safe_open
    from tqdm.auto import tqdm

    disable = not show_progress or os.environ.get("SGLANG_DISABLE_TQDM", "0") == "1"
    for path in tqdm(files, desc="Loading safetensors checkpoint shards", disable=disable, bar_format=BAR_FORMAT):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
