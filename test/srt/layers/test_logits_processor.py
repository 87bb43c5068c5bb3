"""LogitsProcessor: picks each request's last new token, full logits only on request, fp32."""

import torch

from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_executor.forward_batch import ForwardBatch


def _head(v=11, h=6, dtype=torch.float32):
    head = ParallelLMHead(v, h)
    head.weight.data.copy_(torch.randn(v, h, generator=torch.Generator().manual_seed(0)))
    return head.to(dtype)


def test_extend_last_tokens_and_full_logits():
    head = _head()
    ids = [[1, 2, 3], [4], [5, 6]]
    hidden = torch.randn(6, 6)
    ref = hidden @ head.weight.T
    for full in (False, True):
        fb = ForwardBatch.for_extend(ids, [0, 4, 2], [0, 1, 2], torch.zeros(6, dtype=torch.int64),
                                     return_full_logits=full)
        out = LogitsProcessor()(fb.input_ids, hidden, head, fb)
        torch.testing.assert_close(out.next_token_logits, ref[[2, 3, 5]])
        torch.testing.assert_close(out.hidden_states, hidden[[2, 3, 5]])
        if full:
            torch.testing.assert_close(out.full_logits, ref)
        else:
            assert out.full_logits is None


def test_decode_and_dtype_and_softcap():
    head = _head(dtype=torch.bfloat16)
    hidden = torch.randn(3, 6).to(torch.bfloat16)
    fb = ForwardBatch.for_decode([1, 2, 3], [4, 5, 6], [0, 1, 2], torch.zeros(3, dtype=torch.int64))
    out = LogitsProcessor()(fb.input_ids, hidden, head, fb)
    assert out.next_token_logits.dtype == torch.float32 and out.next_token_logits.shape == (3, 11)
    capped = LogitsProcessor(final_logit_softcapping=0.5)(fb.input_ids, hidden, head, fb)
    assert capped.next_token_logits.abs().max() <= 0.5
    torch.testing.assert_close(capped.next_token_logits, torch.tanh(out.next_token_logits / 0.5) * 0.5)


def test_tied_head_shares_embedding():
    emb = VocabParallelEmbedding(11, 6)
    head = ParallelLMHead(11, 6).tie_weights(emb)
    assert head.weight is emb.weight
