"""NGRAM speculative decoding through `launch_server` on the default model (SmolLM2-135M-Instruct),
next to a plain server on the same model: on a copy-heavy prompt the drafts are accepted (upstream's
meta_info `spec_verify_ct` / `spec_accept_length` / `spec_num_correct_drafts` say so, and
/metrics' `sglang:spec_accept_length`) and the greedy output is the plain server's, token for
token, through /generate and the official `openai` client (stop strings, max_tokens, n=2,
json_schema). Pools are whole afterwards."""

from __future__ import annotations

import json

import pytest
import requests

from sglang.test.server_utils import find_free_port, popen_launch_server, start_side_by_side, stop_server

pytestmark = pytest.mark.server

openai = pytest.importorskip("openai")

DOC = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He wound the great clock, "
       "trimmed the wick, polished the lens until it shone, and wrote the weather in a leather logbook: "
       "wind from the north-west, sea moderate, visibility good, two fishing boats returned to harbour.")
COPY = [{"role": "user", "content": f"Copy this text exactly, word for word:\n\n{DOC}"}]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    logs = tmp_path_factory.mktemp("spec_logs")
    ports = {"plain": find_free_port(), "spec": find_free_port()}
    common = ["--max-total-tokens", "8192", "--enable-metrics"]
    procs = start_side_by_side(
        lambda: popen_launch_server("default", ports["plain"], common, log_path=str(logs / "plain.log")),
        lambda: popen_launch_server("default", ports["spec"], common + [
            "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"], log_path=str(logs / "spec.log")))
    urls = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    clients = {k: openai.OpenAI(base_url=u + "/v1", api_key="unused", max_retries=0, timeout=300) for k, u in urls.items()}
    yield {"urls": urls, "clients": clients}
    for c in clients.values():
        c.close()
    for p in reversed(procs):
        stop_server(p)


def _generate(url, **body):
    r = requests.post(url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_copy_heavy_greedy_identity_and_acceptance(servers):
    body = dict(text=f"<|im_start|>user\nCopy this text exactly, word for word:\n\n{DOC}<|im_end|>\n"
                     "<|im_start|>assistant\n",
                sampling_params={"temperature": 0, "max_new_tokens": 64, "ignore_eos": True})
    plain = _generate(servers["urls"]["plain"], **body)
    spec = _generate(servers["urls"]["spec"], **body)
    assert spec["output_ids"] == plain["output_ids"]
    assert spec["text"] == plain["text"]
    meta = spec["meta_info"]
    assert meta["completion_tokens"] == 64
    assert meta["spec_verify_ct"] > 0 and meta["spec_num_correct_drafts"] > 0
    assert meta["spec_accept_length"] == pytest.approx(64 / meta["spec_verify_ct"])
    assert meta["spec_accept_length"] > 1.2  # the copy saves forwards
    assert 0 < meta["spec_accept_rate"] <= 1
    assert "spec_verify_ct" not in plain["meta_info"]
    metrics = requests.get(servers["urls"]["spec"] + "/metrics", timeout=30).text
    assert "sglang:spec_accept_length" in metrics


def test_openai_chat_stop_and_max_tokens(servers):
    plain_c, spec_c = servers["clients"]["plain"], servers["clients"]["spec"]
    ref = plain_c.chat.completions.create(model="default", messages=COPY, temperature=0, max_tokens=60)
    words = ref.choices[0].message.content.split()
    assert len(words) > 8
    stop = words[7]  # a word well inside the copied run
    for kw in (dict(max_tokens=60, stop=[stop]), dict(max_tokens=17), dict(max_tokens=1)):
        a = plain_c.chat.completions.create(model="default", messages=COPY, temperature=0, **kw)
        b = spec_c.chat.completions.create(model="default", messages=COPY, temperature=0, **kw)
        assert b.choices[0].message.content == a.choices[0].message.content, kw
        assert b.choices[0].finish_reason == a.choices[0].finish_reason, kw
        assert b.usage.completion_tokens == a.usage.completion_tokens <= kw["max_tokens"]
    assert a.usage.completion_tokens == 1


def test_n2_and_completions(servers):
    plain_c, spec_c = servers["clients"]["plain"], servers["clients"]["spec"]
    a = plain_c.chat.completions.create(model="default", messages=COPY, temperature=0, max_tokens=40, n=2)
    b = spec_c.chat.completions.create(model="default", messages=COPY, temperature=0, max_tokens=40, n=2)
    assert [c.message.content for c in b.choices] == [c.message.content for c in a.choices]
    prompt = f"{DOC}\n\nThe same text again:\n{DOC[:60]}"
    a = plain_c.completions.create(model="default", prompt=prompt, temperature=0, max_tokens=40)
    b = spec_c.completions.create(model="default", prompt=prompt, temperature=0, max_tokens=40)
    assert b.choices[0].text == a.choices[0].text


def test_json_schema_requests_decode_without_drafts(servers):
    schema = {"type": "object", "properties": {"keeper": {"type": "string"}, "boats": {"type": "integer"}},
              "required": ["keeper", "boats"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "log", "schema": schema, "strict": True}}
    msgs = [{"role": "user", "content": f"{DOC}\n\nAnswer in JSON: who is the story about, and how many boats?"}]
    outs = [servers["clients"][k].chat.completions.create(model="default", messages=msgs, temperature=0, max_tokens=60,
                                                          response_format=fmt) for k in ("plain", "spec")]
    assert outs[1].choices[0].message.content == outs[0].choices[0].message.content
    json.loads(outs[1].choices[0].message.content)


def test_pools_are_whole_afterwards(servers):
    info = requests.get(servers["urls"]["spec"] + "/server_info", timeout=30).json()
    state = info["internal_states"][0] if "internal_states" in info else info
    assert state["num_running_reqs"] == 0
    assert state["protected_kv_tokens"] == 0
    assert state["available_kv_tokens"] + state["evictable_kv_tokens"] == state["max_total_num_tokens"]
    assert state["available_req_slots"] == state["req_pool_size"]
    assert state["spec_verify_ct_total"] > 0 and state["spec_num_correct_drafts_total"] > 0
