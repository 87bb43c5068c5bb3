"""NGRAM speculative decoding through `sglang.Engine` on the default model (SmolLM2-135M-Instruct):
real scheduler and detokenizer subprocesses. The anchor is HF transformers' greedy tokens on the
same weights; a copy-heavy prompt gets its drafts accepted (meta_info), a batch mixing a copy,
a fresh question and n=2 keeps every output, and a stop string ends the text as HF's tokens say."""

import pytest

import sglang
from sglang.test.hf_reference import hf_greedy, load_hf_model

DOC = ("Dear Ms. Rowe, thank you for your letter of the 4th. The shipment of twelve oak chairs left our "
       "workshop on Monday and should reach Bristol by Thursday. Please sign the delivery note and return "
       "the blue copy to us. Kind regards, Thomas Hale, Hale & Sons Furniture.")


@pytest.fixture(scope="module")
def model_dir():
    from sglang.srt.model_loader.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = sglang.Engine(model_path=model_dir, speculative_algorithm="NGRAM", speculative_num_draft_tokens=8,
                        max_total_tokens=8192)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def hf(model_dir):
    return load_hf_model(model_dir)


def _chat_ids(engine, text):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(engine.server_args.model_path)
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)


def _ids(x):
    return list(x["input_ids"]) if hasattr(x, "keys") else list(x)


def test_copy_prompt_greedy_equals_hf_and_drafts_are_accepted(engine, hf):
    ids = _ids(_chat_ids(engine, f"Copy this letter exactly:\n\n{DOC}"))
    out = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 48, "ignore_eos": True})
    assert out["output_ids"] == hf_greedy(hf, ids, 48)
    meta = out["meta_info"]
    assert meta["spec_verify_ct"] < 48 and meta["spec_num_correct_drafts"] > 0
    assert meta["spec_accept_length"] == pytest.approx(48 / meta["spec_verify_ct"])


def test_batch_with_n2_and_a_fresh_prompt(engine, hf):
    copy = _ids(_chat_ids(engine, f"Repeat: {DOC[:120]}"))
    fresh = _ids(_chat_ids(engine, "Name three rivers in Europe."))
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    outs = engine.generate(input_ids=[copy, fresh], sampling_params={**params, "n": 2})
    assert len(outs) == 4
    want_copy, want_fresh = hf_greedy(hf, copy, 24), hf_greedy(hf, fresh, 24)
    assert sorted(o["output_ids"] for o in outs) == sorted([want_copy, want_copy, want_fresh, want_fresh])


def test_stop_string_and_sampling(engine, hf):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(engine.server_args.model_path)
    ids = _ids(_chat_ids(engine, f"Copy this letter exactly:\n\n{DOC}"))
    full = tok.decode(hf_greedy(hf, ids, 40))
    stop = "Bristol" if "Bristol" in full else full.split()[6]
    out = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 40, "stop": stop})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == full[: full.index(stop)]
    # sampled: every token kept within max_new_tokens, a seed makes it reproducible
    sampled = {"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 30, "ignore_eos": True, "sampling_seed": 7}
    a = engine.generate(input_ids=ids, sampling_params=sampled)
    b = engine.generate(input_ids=ids, sampling_params=sampled)
    assert a["meta_info"]["completion_tokens"] == 30
    assert a["output_ids"] == b["output_ids"]
