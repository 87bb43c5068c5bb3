"""LogitsProcessor: picks each request's last new token, full logits only on request, fp32."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

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


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "sgl_kernel"])
@pytest.mark.parametrize("packed", [False, True])
def test_bf16_logits_are_the_bf16_head_widened_and_fp32_head_gives_the_fp32_sums(kernel, packed):
    """Default: the logits are the bf16 LM head's result widened to fp32 (what upstream's bf16 head
    gives), whichever path computes them. --enable-fp32-lm-head (`fp32_lm_head`): the head's sums
    in fp32, which differ from the widened bf16 ones."""
    from sglang.srt.layers import cpu_ops
    from sglang.srt.layers.linear import pack_linear_weights

    if kernel and not cpu_ops.available():
        pytest.skip(f"sgl-kernel not in use: {cpu_ops.describe()}")
    path = contextlib.nullcontext() if kernel else cpu_ops.torch_fallbacks()
    head = _head(v=96, h=40, dtype=torch.bfloat16)  # 96 rows: panels where sgl-kernel packs bf16
    if packed:
        pack_linear_weights(head)
    hidden = torch.randn(5, 40, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    fb = ForwardBatch.for_decode([1] * 5, [4] * 5, list(range(5)), torch.zeros(5, dtype=torch.int64))
    with path:
        widened = LogitsProcessor()(fb.input_ids, hidden, head, fb).next_token_logits
        fp32 = LogitsProcessor()
        fp32.fp32_lm_head = True
        sums = fp32(fb.input_ids, hidden, head, fb).next_token_logits
    assert widened.dtype == sums.dtype == torch.float32
    assert torch.equal(widened, F.linear(hidden.float(), head.weight.float()).bfloat16().float())
    torch.testing.assert_close(sums, F.linear(hidden.float(), head.weight.float()), atol=1e-5, rtol=1e-5)
    assert not torch.equal(sums, widened)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_argmax_only_decode_returns_the_argmax_instead_of_the_logits(dtype):
    """forward_batch.argmax_only on a decode batch: next_token_ids = argmax of the logits the head
    would give (bf16 widened, or the fp32 sums with fp32_lm_head), no logits, where the head is in
    sgl-kernel panels; with a softcap, unpacked, on the torch path, or in an extend batch: logits."""
    from sglang.srt.layers import cpu_ops
    from sglang.srt.layers.linear import pack_linear_weights

    if not cpu_ops.linear_panels_enabled(dtype):
        pytest.skip(f"no {dtype} panels here: {cpu_ops.describe()}")
    head = _head(v=4096, h=64, dtype=dtype)
    plain = _head(v=4096, h=64, dtype=dtype)
    pack_linear_weights(head)
    hidden = torch.randn(6, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    fb = ForwardBatch.for_decode([1] * 6, [4] * 6, list(range(6)), torch.zeros(6, dtype=torch.int64))
    for fp32_head in (False, True):
        proc = LogitsProcessor()
        proc.fp32_lm_head = fp32_head
        fb.argmax_only = False
        logits = proc(fb.input_ids, hidden, head, fb)
        assert logits.next_token_ids is None
        fb.argmax_only = True
        out = proc(fb.input_ids, hidden, head, fb)
        assert out.next_token_logits is None and out.next_token_ids.dtype == torch.int64
        assert torch.equal(out.next_token_ids, torch.argmax(logits.next_token_logits, dim=-1))
        torch.testing.assert_close(out.hidden_states, hidden)
    for proc, h in ((LogitsProcessor(final_logit_softcapping=30.0), head), (LogitsProcessor(), plain)):
        out = proc(fb.input_ids, hidden, h, fb)
        assert out.next_token_ids is None and out.next_token_logits.shape == (6, 4096)
    with cpu_ops.torch_fallbacks():
        assert LogitsProcessor()(fb.input_ids, hidden, head, fb).next_token_ids is None
    ext = ForwardBatch.for_extend([[1], [2]], [0, 0], [0, 1], torch.zeros(2, dtype=torch.int64))
    ext.argmax_only = True
    assert LogitsProcessor()(ext.input_ids, hidden[:2], head, ext).next_token_ids is None
