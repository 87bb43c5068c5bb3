"""SGLang-compatible LLM inference server (CPU-first fork)."""

__version__ = "0.5.23.post0"


def __getattr__(name):
    # Lazy: `import sglang` stays cheap (no torch) for the CLI checker and launchers.
    if name == "Engine":
        from sglang.srt.entrypoints.engine import Engine

        return Engine
    raise AttributeError(f"module 'sglang' has no attribute {name!r}")
