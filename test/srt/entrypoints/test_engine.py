"""The offline Engine: real scheduler and detokenizer subprocesses over ZMQ, upstream's return shapes."""

import psutil
import pytest

import sglang
from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("engine_llama")), "llama", seed=2)


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = sglang.Engine(model_path=model_dir, max_total_tokens=4096, dtype="float32")
    yield eng
    eng.shutdown()


GREEDY = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}


def test_single_prompt_shape_and_hf_parity(engine, model_dir):
    from transformers import AutoTokenizer

    out = engine.generate("Hello there, how are", GREEDY)
    assert set(out) >= {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["completion_tokens"] == 8 and meta["num_retractions"] == 0
    assert meta["id"] and meta["e2e_latency"] > 0
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok.encode("Hello there, how are")
    assert meta["prompt_tokens"] == len(ids)
    assert out["output_ids"] == hf_greedy(load_hf_model(model_dir), ids, 8)
    assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=True)


def test_batch_and_input_ids(engine):
    outs = engine.generate(["a b c", "d e f g"], GREEDY)
    assert isinstance(outs, list) and len(outs) == 2
    again = engine.generate(input_ids=[[5, 6, 7], [8, 9]], sampling_params=GREEDY)
    assert [len(o["output_ids"]) for o in again] == [8, 8]


def test_stream_chunks_grow_to_final(engine):
    chunks = list(engine.generate("Streaming test", {**GREEDY, "max_new_tokens": 6}, stream=True))
    assert len(chunks) >= 2
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    for a, b in zip(chunks, chunks[1:]):
        assert b["text"].startswith(a["text"])
    full = engine.generate("Streaming test", {**GREEDY, "max_new_tokens": 6})
    assert chunks[-1]["output_ids"] == full["output_ids"]


def test_slow_stream_consumer_gets_every_chunk(engine):
    """A consumer that awaits between chunks (an HTTP client on a slow link): the final chunks arrive
    while the stream is suspended in a yield, and must still be delivered, the last with its reason."""
    import asyncio

    async def consume():
        chunks = []
        gen = await engine.async_generate("Streaming test", {**GREEDY, "max_new_tokens": 6}, stream=True)
        async for c in gen:
            chunks.append(c)
            await asyncio.sleep(0.3)
        return chunks

    chunks = engine.loop.run_until_complete(consume())
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert len(chunks[-1]["output_ids"]) == 6


def test_invalid_sampling_params_raise(engine):
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 1.5."):
        engine.generate("x", {"top_p": 1.5})


def test_server_info_and_flush(engine):
    info = engine.get_server_info()
    st = info["internal_states"][0]
    assert st["num_running_reqs"] == 0
    assert engine.flush_cache().success is True


def test_shutdown_leaves_no_children(model_dir):
    eng = sglang.Engine(model_path=model_dir, max_total_tokens=1024)
    workers = [psutil.Process(p.pid) for p in eng._procs.processes]
    children = workers + [c for w in workers for c in w.children(recursive=True)]
    assert len(workers) == 2
    eng.shutdown()
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive


def test_a_script_exits_cleanly_without_a_traceback(model_dir, tmp_path):
    """A user's script: generate, then let the interpreter exit (the atexit hook shuts the Engine
    down). zmq.asyncio sockets left to interpreter teardown printed `TypeError: 'NoneType' object
    is not callable` tracebacks from their finalizers."""
    import subprocess
    import sys

    script = tmp_path / "gen.py"
    script.write_text(
        "import sglang\n"
        "if __name__ == '__main__':\n"
        f"    eng = sglang.Engine(model_path={model_dir!r}, max_total_tokens=1024)\n"
        "    print(len(eng.generate('hi', {'max_new_tokens': 2})['output_ids']))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("2")
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
