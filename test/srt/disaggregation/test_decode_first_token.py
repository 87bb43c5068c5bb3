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
