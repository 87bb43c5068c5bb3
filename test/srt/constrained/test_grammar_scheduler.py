"""Structured output in the scheduler, on a tiny random Llama with the real SmolLM2 tokenizer:
whatever the random weights prefer, the output is in the grammar's language and ends when the
grammar does (finish "stop"), through batching, n>1 (one compilation), retraction and bad specs;
every pool is free afterwards."""

import json
import re

import jsonschema
import pytest

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test import scheduler_utils
from sglang.test.scheduler_utils import assert_no_leak, random_prompts, run_to_completion
from sglang.test.tiny_models import make_tiny_model

REGEX = r'\{"name": "[a-z]{1,8}", "population": [1-9][0-9]{0,5}\}'
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]},
        "rank": {"type": "integer", "minimum": 1, "maximum": 99},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "rank", "capital"],
    "additionalProperties": False,
}
EBNF = 'root ::= "answer: " ("yes" | "no") " (" [0-9] ")"'


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("tiny_llama_grammar")), "llama", seed=5)


def make_scheduler(model_dir, **kw):
    args = dict(max_total_tokens=4096, chunked_prefill_size=64, page_size=1, max_running_requests=32,
                constrained_json_disable_any_whitespace=True)
    args.update(kw)
    return scheduler_utils.make_scheduler(model_dir, **args)


def submit(sched, rid, ids, max_new_tokens=60, **sampling):
    params = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
    params.normalize(sched.tokenizer)
    params.verify(sched.model_config.vocab_size)
    return sched.add_request(TokenizedGenerateReqInput(rid=rid, input_text=None, input_ids=ids,
                                                       sampling_params=params))


def text_of(sched, req):
    return sched.tokenizer.decode(req.output_ids, skip_special_tokens=True)


def assert_stopped_by_grammar(sched, req):
    assert req.finished_reason.to_json()["type"] == "stop", (req.rid, req.finished_reason.to_json())
    assert req.output_ids[-1] in sched.intake.limits.eos_token_ids  # the grammar ends by allowing only EOS


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_kind_of_constraint_in_one_batch(model_dir, temperature):
    sched = make_scheduler(model_dir)
    prompts = random_prompts([5, 17, 33, 64], seed=2)
    reqs = [
        submit(sched, "regex", prompts[0], regex=REGEX, temperature=temperature),
        submit(sched, "json", prompts[1], json_schema=json.dumps(SCHEMA), temperature=temperature),
        submit(sched, "ebnf", prompts[2], ebnf=EBNF, temperature=temperature),
        submit(sched, "free", prompts[3], max_new_tokens=12, temperature=temperature, ignore_eos=True),
    ]
    run_to_completion(sched)
    for req in reqs[:3]:
        assert_stopped_by_grammar(sched, req)
    assert re.fullmatch(REGEX, text_of(sched, reqs[0])), text_of(sched, reqs[0])
    jsonschema.validate(json.loads(text_of(sched, reqs[1])), SCHEMA)
    assert re.fullmatch(r"answer: (yes|no) \([0-9]\)", text_of(sched, reqs[2]))
    assert len(reqs[3].output_ids) == 12  # the unconstrained row of the batch is untouched
    assert_no_leak(sched)


def test_any_json_object_and_n_requests_share_one_compilation(model_dir):
    sched = make_scheduler(model_dir, constrained_json_max_whitespace_cnt=1, constrained_json_disable_any_whitespace=False)
    prompt = random_prompts([9], seed=4)[0]
    reqs = [submit(sched, f"obj{i}", prompt, max_new_tokens=200, json_schema='{"type": "object", "maxProperties": 1}',
                   temperature=1.0, sampling_seed=i) for i in range(4)]
    run_to_completion(sched)
    assert sched.grammar_manager.backend.cache_size() == 1
    for req in reqs:
        if req.finished_reason.to_json()["type"] == "stop":
            assert isinstance(json.loads(text_of(sched, req)), dict)
        else:  # a random model may nest deeply: whatever came out is a JSON prefix
            assert text_of(sched, req).startswith("{")
    assert_no_leak(sched)


def test_grammar_state_survives_retraction(model_dir):
    # 8 requests x (40 prompt + ~60 output) tokens do not fit into 320 KV slots at once.
    sched = make_scheduler(model_dir, max_total_tokens=320, chunked_prefill_size=64)
    prompts = random_prompts([40] * 8, seed=11)
    long_regex = r"[ab]( [ab]){59}"
    # compiled first: otherwise the requests leave the grammar queue whenever the worker thread is
    # done, and the admission (so whether the pool runs out) depends on thread timing
    sched.grammar_manager.backend.get_future(("regex", long_regex)).result()
    reqs = [submit(sched, f"q{i}", p, max_new_tokens=130, regex=long_regex, temperature=0.0) for i, p in enumerate(prompts)]
    run_to_completion(sched)
    assert sum(r.num_retractions for r in reqs) > 0
    for req in reqs:
        assert_stopped_by_grammar(sched, req)
        assert re.fullmatch(long_regex, text_of(sched, req)), (req.rid, text_of(sched, req))
    assert_no_leak(sched)


@pytest.mark.parametrize("kind, spec, words", [
    ("json_schema", "{not json", "Invalid json_schema"),
    ("json_schema", '{"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}', "Invalid json_schema"),
    ("regex", "(unclosed", "Invalid regex"),
    ("ebnf", "root ::= undefined_rule", "Invalid ebnf"),
])
def test_bad_spec_is_a_400_and_the_scheduler_goes_on(model_dir, kind, spec, words):
    sched = make_scheduler(model_dir)
    bad = submit(sched, "bad", [5, 6, 7], **{kind: spec})
    good = submit(sched, "good", [5, 6, 7], regex=REGEX)
    run_to_completion(sched)
    reason = bad.finished_reason.to_json()
    assert reason["type"] == "abort" and reason["status_code"] == 400
    assert words in reason["message"], reason["message"]
    assert_stopped_by_grammar(sched, good)
    # the failure is cached: the same bad spec again fails at once, with the same text
    again = submit(sched, "again", [5, 6, 7], **{kind: spec})
    run_to_completion(sched)
    assert again.finished_reason.to_json()["message"] == reason["message"]
    assert_no_leak(sched)


def test_grammar_backend_none_refuses_constraints(model_dir):
    sched = make_scheduler(model_dir, grammar_backend="none")
    req = submit(sched, "r", [1, 2, 3], regex="a+")
    run_to_completion(sched)
    reason = req.finished_reason.to_json()
    assert reason["status_code"] == 400 and "--grammar-backend none" in reason["message"]
    assert_no_leak(sched)


def test_abort_while_waiting_for_the_grammar(model_dir):
    sched = make_scheduler(model_dir)
    req = submit(sched, "r", [1, 2, 3], json_schema=json.dumps(SCHEMA))
    assert req in sched.grammar_manager.reqs()
    sched.abort_request("r")
    run_to_completion(sched)
    assert req.finished_reason.to_json()["type"] == "abort"
    assert not sched.grammar_manager.queue
    assert_no_leak(sched)


def _slow_schema(tag: str) -> str:
    """A schema xgrammar needs seconds to compile (many bounded-pattern fields)."""
    props = {f"{tag}_{i}": {"type": "string", "pattern": "[a-z]{1,%d}" % (i + 3)} for i in range(60)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


def test_a_slow_compilation_does_not_stall_other_requests(model_dir):
    import time

    sched = make_scheduler(model_dir)
    slow = submit(sched, "slow", [1, 2, 3], max_new_tokens=4, json_schema=_slow_schema("a"))
    fast = submit(sched, "fast", [4, 5, 6], max_new_tokens=16, temperature=0.0, ignore_eos=True)
    t0 = time.monotonic()
    while not fast.finished():
        sched.step()
    assert slow in sched.grammar_manager.reqs(), "the fast request waited for the compilation"
    assert time.monotonic() - t0 < 3.0
    run_to_completion(sched, max_steps=100_000)
    assert slow.finished_reason is not None and slow.finished_reason.to_json()["type"] in ("stop", "length")
    assert_no_leak(sched)


def test_grammar_timeout_is_a_clear_400(model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_GRAMMAR_TIMEOUT", "0.3")
    sched = make_scheduler(model_dir)
    req = submit(sched, "slow", [1, 2, 3], json_schema=_slow_schema("b"))
    run_to_completion(sched, max_steps=100_000)
    reason = req.finished_reason.to_json()
    assert reason["status_code"] == 400 and reason["message"] == "Grammar preprocessing timed out for key=json"
    assert_no_leak(sched)


@pytest.fixture(scope="module")
def thinking_model_dir(tmp_path_factory):
    """The tiny Llama with `<think>` / `</think>` as single tokens (ids 49152, 49153)."""
    from transformers import AutoTokenizer

    path = make_tiny_model(str(tmp_path_factory.mktemp("tiny_thinking")), "llama", seed=5, vocab_size=49154)
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_tokens(["<think>", "</think>"])
    tok.save_pretrained(path)
    return path


def test_grammar_starts_after_the_reasoning_section(thinking_model_dir):
    sched = make_scheduler(thinking_model_dir, reasoning_parser="deepseek-r1")
    think_end = sched.tokenizer.convert_tokens_to_ids("</think>")
    assert sched.grammar_manager.reasoning == (think_end - 1, think_end, True)
    # Reasoning is free: a bias makes the model close it at once; the grammar then masks the bias away.
    closing = submit(sched, "closing", [3, 4, 5], regex="(yes|no)", temperature=0.0, logit_bias={str(think_end): 100.0})
    free = submit(sched, "free", [3, 4, 5], max_new_tokens=6, regex="(yes|no)", temperature=0.0)
    run_to_completion(sched)
    assert closing.output_ids[0] == think_end
    assert_stopped_by_grammar(sched, closing)
    assert sched.tokenizer.decode(closing.output_ids[1:], skip_special_tokens=True) in ("yes", "no")
    # still reasoning after 6 tokens: nothing was masked (a random model does not pick </think>)
    assert free.finished_reason.to_json()["type"] == "length" and think_end not in free.output_ids
    assert_no_leak(sched)


def test_unforced_reasoning_parser_lets_the_first_token_choose(thinking_model_dir):
    sched = make_scheduler(thinking_model_dir, reasoning_parser="qwen3")
    think_start = sched.tokenizer.convert_tokens_to_ids("<think>")
    direct = submit(sched, "direct", [3, 4, 5], regex="(yes|no)", temperature=0.0, logit_bias={str(think_start): -100.0})
    thinking = submit(sched, "thinking", [3, 4, 5], max_new_tokens=5, regex="(yes|no)", temperature=0.0,
                      logit_bias={str(think_start): 100.0})
    run_to_completion(sched)
    assert_stopped_by_grammar(sched, direct)  # no <think>: constrained from the first token
    assert sched.tokenizer.decode(direct.output_ids, skip_special_tokens=True) in ("yes", "no")
    assert thinking.output_ids[0] == think_start and thinking.finished_reason.to_json()["type"] == "length"
    assert_no_leak(sched)


def test_allow_token_sets_every_bit_position():
    import torch
    import xgrammar as xgr

    from sglang.srt.constrained.reasoner_grammar_backend import allow_token

    mask = torch.zeros(1, 2, dtype=torch.int32)
    for t in (0, 5, 31, 32, 63):
        allow_token(mask, 0, t)
    logits = torch.zeros(1, 64)
    xgr.apply_token_bitmask_inplace(logits, mask)
    assert torch.isfinite(logits[0]).nonzero().view(-1).tolist() == [0, 5, 31, 32, 63]


def test_structural_tags_both_formats(model_dir):
    """xgrammar's structural-tag format (a fixed text then JSON), and upstream's legacy
    {"structures", "triggers"} form (free text; a trigger starts the tagged schema)."""
    sched = make_scheduler(model_dir)
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "Answer: "},
        {"type": "json_schema", "json_schema": {"type": "integer", "minimum": 0, "maximum": 9}}]}}
    legacy = {"structures": [{"begin": "<f>", "schema": {"type": "integer"}, "end": "</f>"}], "triggers": ["<f>"]}
    a = submit(sched, "tag", [7, 8, 9], structural_tag=json.dumps(tag), temperature=0.0)
    b = submit(sched, "legacy", [7, 8, 9], max_new_tokens=8, structural_tag=json.dumps(legacy), temperature=0.0)
    bad = submit(sched, "bad", [7, 8, 9], structural_tag='{"type": "structural_tag", "format": {"type": "nope"}}')
    run_to_completion(sched)
    assert_stopped_by_grammar(sched, a)
    assert re.fullmatch(r"Answer: [0-9]", text_of(sched, a)), text_of(sched, a)
    assert b.finished_reason.to_json()["type"] in ("length", "stop")
    assert bad.finished_reason.to_json()["status_code"] == 400
    assert "Invalid structural_tag" in bad.finished_reason.to_json()["message"]
    assert_no_leak(sched)


def test_a_chunked_prompt_and_a_radix_hit_keep_the_grammar(model_dir):
    """The grammar starts at the first sampled token whatever the prompt went through: a prompt
    of three 64-token chunks, then the same prompt again served from the radix tree."""
    sched = make_scheduler(model_dir)
    sched.grammar_manager.backend.get_future(("json", json.dumps(SCHEMA))).result()  # no grammar-queue timing
    prompt = random_prompts([150], seed=13)[0]
    first = submit(sched, "chunked", prompt, json_schema=json.dumps(SCHEMA), temperature=0.0)
    for _ in range(2000):  # steps without a forward while the grammar is still compiling
        sched.step()
        if sched.chunked_req is first:
            break
    assert sched.chunked_req is first and not first.output_ids  # prefilled in chunks, nothing sampled yet
    run_to_completion(sched)
    again = submit(sched, "hit", prompt, json_schema=json.dumps(SCHEMA), temperature=0.0)
    run_to_completion(sched)
    assert first.cached_tokens == 0 and again.cached_tokens >= 128, (first.cached_tokens, again.cached_tokens)
    for req in (first, again):
        assert_stopped_by_grammar(sched, req)
        jsonschema.validate(json.loads(text_of(sched, req)), SCHEMA)
    assert_no_leak(sched)
