"""A PD decode server streams a request's first token (sampled by the prefill server, arrived with
its KV) as soon as the transfer completes, as upstream's prebuilt batch does: not after the next
decode forward, which on shared cores may wait behind the prefill server's turn. A prefill and a
decode scheduler run in this process over the real Mooncake engine (TCP on loopback); the decode
side's outputs are caught at its `send_outputs` hook, where the process loop sends them."""

import pytest

from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.scheduler_utils import InProcessPD, random_prompts
from sglang.test.tiny_models import make_tiny_model

NEW_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("first_token_llama")), "llama", seed=3)


def test_first_token_is_sent_before_the_next_decode_forward(model_dir):
    pytest.importorskip("mooncake.engine")
    pd = InProcessPD(model_dir)
    sent = {}  # rid -> [(tokens in the message, tokens the request held when it was sent)]
    live = {}

    def send(outs):
        for out in outs:
            for rid, ids in zip(out.rids, out.output_ids):
                sent.setdefault(rid, []).append((len(ids), len(live[rid].output_ids)))

    pd.decode.send_outputs = send
    try:
        prompts = random_prompts([9, 14, 21], seed=4, vocab_hi=1000)
        orig_add = pd.decode.add_request

        def add(recv):
            req = orig_add(recv)
            live[req.rid] = req
            return req

        pd.decode.add_request = add
        reqs = pd.run(prompts, NEW_TOKENS, stream=True)
    finally:
        pd.close()
    hf = load_hf_model(model_dir)
    for req, ids in zip(reqs, prompts):
        msgs = sent[req.rid]
        # The first message carries the prefill's token alone, sent while the request held only it
        # (after the next decode forward it would hold two).
        assert msgs[0] == (1, 1), msgs
        assert [n for n, _ in msgs] == list(range(1, NEW_TOKENS + 1)), msgs  # then one token a message
        assert req.output_ids == hf_greedy(hf, ids, NEW_TOKENS)


def test_a_failed_early_send_loses_no_output(model_dir):
    # The early send happens inside the step: if it raises, the step fails, but the messages it
    # held go out with the next send (a lost first message would leave the client without token 1).
    import time

    pytest.importorskip("mooncake.engine")
    pd = InProcessPD(model_dir)
    offsets, failures = {}, []

    def send(outs):
        if any(out.rids for out in outs) and not failures:
            failures.append("first send")
            raise RuntimeError("send failed")
        for out in outs:
            for rid, offset in zip(out.rids, out.read_offsets):
                offsets.setdefault(rid, []).append(offset)

    pd.decode.send_outputs = send
    try:
        prompts = random_prompts([9, 14], seed=5, vocab_hi=1000)
        for i, ids in enumerate(prompts):
            pd.prefill.add_request(pd.request(f"p{i}", ids, NEW_TOKENS, 8000 + i, stream=True))
            pd.decode.add_request(pd.request(f"d{i}", ids, NEW_TOKENS, 8000 + i, stream=True))
        deadline = time.monotonic() + 60
        while (pd.prefill.has_work() or pd.decode.has_work()) and time.monotonic() < deadline:
            pd.prefill.step()
            try:
                send(pd.decode.step())
            except RuntimeError:
                pass  # the failed step; the loop goes on, as the process loop does
            time.sleep(0.001)
        send(pd.decode.take_outputs())
    finally:
        pd.close()
    assert failures == ["first send"]
    for i in range(len(prompts)):
        assert offsets[f"d{i}"] == list(range(NEW_TOKENS)), offsets  # every message, none lost
