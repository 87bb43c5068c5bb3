"""Embedding servers (`--is-embedding`) from the outside: `/v1/embeddings` with the official
openai client (also through the real sglang-router), `/encode`, `/v1/rerank` and `/v1/score` on
a sequence-classification reranker. Vectors and scores are checked against HF transformers on
the same weights; errors against upstream's messages; KV pools are whole again afterwards."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys

import pytest
import requests
import torch

from sglang.test.hf_reference import hf_pooled
from sglang.test.server_utils import find_free_port, popen_launch_server, start_side_by_side, stop_server, wait_for_health
from sglang.test.tiny_models import make_tiny_model, write_sentence_transformers_pooling

pytestmark = pytest.mark.server

openai = pytest.importorskip("openai")

MAX_TOTAL_TOKENS = 2048
MATRYOSHKA = [16, 32]
PROMPTS = [[11, 12, 13], list(range(100, 140)), [7]]  # the 40-token one spans three 16-token chunks
NOT_GENERATION = ("This server runs an embedding model (--is-embedding): it answers /v1/embeddings, /encode, "
                  "/v1/rerank and /v1/score, not text generation.")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    emb = make_tiny_model(str(tmp_path_factory.mktemp("tiny_embed")), "llama", seed=11)
    write_sentence_transformers_pooling(emb, "mean", normalize=True)
    with open(os.path.join(emb, "config.json")) as f:
        cfg = json.load(f)
    cfg["matryoshka_dimensions"] = MATRYOSHKA
    with open(os.path.join(emb, "config.json"), "w") as f:
        json.dump(cfg, f)
    rer = make_tiny_model(str(tmp_path_factory.mktemp("tiny_rerank")), "qwen3", seed=12, sequence_classification=True)
    logs = tmp_path_factory.mktemp("log")
    ports = [find_free_port(), find_free_port()]
    common = ["--is-embedding", "--chunked-prefill-size", "16", "--max-total-tokens", str(MAX_TOTAL_TOKENS)]
    procs = start_side_by_side(
        lambda: popen_launch_server(emb, ports[0], common + ["--served-model-name", "tiny-embed"],
                                    log_path=str(logs / "embed.log")),
        lambda: popen_launch_server(rer, ports[1], common, log_path=str(logs / "rerank.log")),
    )
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    client = openai.OpenAI(base_url=urls[0] + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield {"embed": urls[0], "rerank": urls[1], "embed_model": emb, "rerank_model": rer, "client": client}
    client.close()
    for p in procs:
        stop_server(p)


def _vec(x):
    return torch.tensor(x, dtype=torch.float32)


def _close(a, b, tol=2e-5):
    return torch.allclose(_vec(a), _vec(b), atol=tol, rtol=0)


def _idle_kv(url):
    state = requests.get(url + "/server_info", timeout=30).json()["internal_states"][0]
    return state["protected_kv_tokens"], state["available_kv_tokens"] + state["evictable_kv_tokens"]


# ------------------------------------------------------------------------------------ embeddings


def test_openai_client_embeddings_match_hf_mean_pooling(servers):
    """The client asks for base64 by default and decodes it; floats when asked for them."""
    refs = hf_pooled(servers["embed_model"], PROMPTS, "mean")
    res = servers["client"].embeddings.create(model="tiny-embed", input=PROMPTS)
    assert [d.index for d in res.data] == [0, 1, 2]
    for d, ref in zip(res.data, refs):
        assert len(d.embedding) == 64 and _close(d.embedding, ref)
    assert res.usage.prompt_tokens == res.usage.total_tokens == sum(len(p) for p in PROMPTS)
    floats = servers["client"].embeddings.create(model="tiny-embed", input=PROMPTS[1], encoding_format="float")
    assert _close(floats.data[0].embedding, refs[1])


def test_base64_is_little_endian_float32(servers):
    r = requests.post(servers["embed"] + "/v1/embeddings", json={"input": PROMPTS[0], "encoding_format": "base64"},
                      timeout=60)
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    assert _close(struct.unpack(f"<{len(raw) // 4}f", raw), hf_pooled(servers["embed_model"], PROMPTS[:1], "mean")[0])
    bad = requests.post(servers["embed"] + "/v1/embeddings", json={"input": "x", "encoding_format": "int8"}, timeout=60)
    assert bad.status_code == 400 and "encoding_format" in bad.json()["message"]


def test_text_input_is_tokenized_like_the_tokenizer(servers):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(servers["embed_model"])("The capital of France")["input_ids"]
    res = servers["client"].embeddings.create(model="tiny-embed", input=["The capital of France", "again"])
    assert len(res.data) == 2
    assert _close(res.data[0].embedding, hf_pooled(servers["embed_model"], [ids], "mean")[0])


def test_matryoshka_dimensions_truncate_and_renormalise(servers):
    full = hf_pooled(servers["embed_model"], PROMPTS[1:2], "mean")[0]
    res = servers["client"].embeddings.create(model="tiny-embed", input=PROMPTS[1], dimensions=16,
                                              encoding_format="float")
    got = res.data[0].embedding
    assert len(got) == 16 and _close(got, torch.nn.functional.normalize(_vec(full[:16]), dim=-1))
    for dims, message in ((0, "Requested dimensions must be greater than 0"),
                          (20, f"only supports {MATRYOSHKA} matryoshka dimensions")):
        with pytest.raises(openai.BadRequestError) as e:
            servers["client"].embeddings.create(model="tiny-embed", input="x", dimensions=dims)
        assert message in str(e.value)


@pytest.mark.parametrize("value, message", [
    ("", "Input cannot be empty"),
    ("   ", "Input cannot be empty or whitespace only"),
    (["ok", " "], "Input at index 1 cannot be empty or whitespace only"),
    ([1, -2], "Token ID at index 1 must be non-negative"),
    ([[1], [2, -3]], "Input at index 1 contains negative token IDs"),
])
def test_invalid_inputs_are_upstreams_400s(servers, value, message):
    r = requests.post(servers["embed"] + "/v1/embeddings", json={"input": value}, timeout=30)
    assert r.status_code == 400
    assert r.json()["message"] == message and r.json()["type"] == "BadRequestError"


def test_native_encode_and_generation_refused(servers):
    one = requests.post(servers["embed"] + "/encode", json={"input_ids": PROMPTS[0]}, timeout=30).json()
    assert _close(one["embedding"], hf_pooled(servers["embed_model"], PROMPTS[:1], "mean")[0])
    assert one["meta_info"]["prompt_tokens"] == 3
    batch = requests.post(servers["embed"] + "/encode", json={"input_ids": PROMPTS[:2]}, timeout=30).json()
    assert isinstance(batch, list) and len(batch) == 2
    chat = requests.post(servers["embed"] + "/v1/chat/completions", timeout=30,
                         json={"model": "tiny-embed", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["message"] == NOT_GENERATION
    gen = requests.post(servers["embed"] + "/generate", json={"text": "hi"}, timeout=30)
    assert gen.status_code == 400 and gen.json()["error"]["message"] == NOT_GENERATION
    info = requests.get(servers["embed"] + "/model_info", timeout=30).json()
    assert info["is_generation"] is False
    rr = requests.post(servers["embed"] + "/v1/rerank", json={"query": "q", "documents": ["d"]}, timeout=30)
    assert rr.status_code == 400 and "ForSequenceClassification" in rr.json()["message"]


def test_through_the_sglang_router(servers, tmp_path):
    port = find_free_port()
    log = open(tmp_path / "router.log", "wb")
    router = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", servers["embed"],
                               "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(find_free_port())],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_health(url, timeout=60, process=router)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        res = client.embeddings.create(model="tiny-embed", input=PROMPTS)
        for d, ref in zip(res.data, hf_pooled(servers["embed_model"], PROMPTS, "mean")):
            assert _close(d.embedding, ref)
        client.close()
    finally:
        router.terminate()
        router.wait(30)
        log.close()


def test_kv_is_whole_after_everything(servers):
    """Runs last in this group: every request above gave its KV back (free or in the tree)."""
    assert _idle_kv(servers["embed"]) == (0, MAX_TOTAL_TOKENS)


# ------------------------------------------------------------------------------------ rerank and score


def _pair_ids(model, query, docs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return [tok(query, d)["input_ids"] for d in docs]


def test_rerank_scores_are_the_classifier_logits_best_first(servers):
    query, docs = "what is a cat", ["a cat is an animal", "paris", "dogs bark", "cats purr"]
    refs = [v[0] for v in hf_pooled(servers["rerank_model"], _pair_ids(servers["rerank_model"], query, docs))]
    out = requests.post(servers["rerank"] + "/v1/rerank", json={"query": query, "documents": docs}, timeout=60).json()
    assert sorted(r["index"] for r in out) == [0, 1, 2, 3]
    assert [r["score"] for r in out] == sorted((r["score"] for r in out), reverse=True)
    for r in out:
        assert abs(r["score"] - refs[r["index"]]) < 2e-5 and r["document"] == docs[r["index"]]
        assert r["meta_info"]["prompt_tokens"] > 0
    top = requests.post(servers["rerank"] + "/v1/rerank", timeout=60,
                        json={"query": query, "documents": docs, "top_n": 2, "return_documents": False}).json()
    assert [r["index"] for r in top] == [r["index"] for r in out[:2]] and all("document" not in r for r in top)
    many = requests.post(servers["rerank"] + "/v1/rerank", json={"query": query, "documents": docs, "top_n": 10},
                         timeout=60).json()
    assert len(many) == 4


@pytest.mark.parametrize("body, message", [
    ({"query": "", "documents": ["a"]}, "Query cannot be empty"),
    ({"query": " ", "documents": ["a"]}, "Query cannot be empty or whitespace only"),
    ({"query": "q", "documents": []}, "Documents cannot be empty"),
    ({"query": "q", "documents": ["a", ""]}, "Each document must be a non-empty string"),
    ({"query": "q", "documents": ["a", "  "]}, "Each document cannot be empty or whitespace only"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "parameter top_n should be larger than 0."),
])
def test_rerank_validation(servers, body, message):
    r = requests.post(servers["rerank"] + "/v1/rerank", json=body, timeout=30)
    assert r.status_code == 400 and message in r.json()["message"]


def test_score_on_a_classifier_is_its_logits(servers):
    ids = [[5, 6, 7, 8], [5, 6, 9]]
    r = requests.post(servers["rerank"] + "/v1/score", json={"query": [5, 6], "items": [[7, 8], [9]]}, timeout=30)
    assert r.status_code == 200 and r.json()["object"] == "scoring"
    for got, ref in zip(r.json()["scores"], hf_pooled(servers["rerank_model"], ids)):
        assert _close(got, ref)
    soft = requests.post(servers["rerank"] + "/v1/score", timeout=30,
                         json={"query": [5, 6], "items": [[7, 8]], "apply_softmax": True}).json()
    assert soft["scores"] == [[1.0]]  # one label: its softmax is 1
    assert _idle_kv(servers["rerank"]) == (0, MAX_TOTAL_TOKENS)
