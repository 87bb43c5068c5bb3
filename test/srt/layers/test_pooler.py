"""How an embedding server pools: read from the model folder (sentence-transformers files,
sequence-classification heads, the decoder default), and accumulated over prefill chunks."""

import json

import torch

from sglang.srt.layers import pooler
from sglang.test.tiny_models import write_sentence_transformers_pooling


def _folder(tmp_path, hidden=8):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": hidden}))
    return str(tmp_path)


def test_decoder_default_is_normalised_last_token(tmp_path):
    cfg = pooler.read_pooling_config(_folder(tmp_path), "Qwen3ForCausalLM")
    assert (cfg.pooling_type, cfg.normalize, cfg.classifier) == ("last", True, False)
    assert not cfg.needs_all_tokens


def test_sentence_transformers_files_choose_the_pooling(tmp_path):
    for mode, normalize in (("mean", True), ("cls", False), ("last", True)):
        path = write_sentence_transformers_pooling(_folder(tmp_path), mode, normalize)
        if not normalize:
            (tmp_path / "2_Normalize").mkdir(exist_ok=True)  # a folder alone is not a module
        cfg = pooler.read_pooling_config(path, "LlamaForCausalLM")
        assert (cfg.pooling_type, cfg.normalize) == (mode, normalize)
        assert cfg.needs_all_tokens == (mode != "last")


def test_sequence_classification_gives_raw_logits_unless_an_activation_is_named(tmp_path):
    cfg = pooler.read_pooling_config(_folder(tmp_path), "Qwen3ForSequenceClassification", {})
    assert cfg.classifier and not cfg.normalize and cfg.activation is None
    logits = torch.tensor([2.0, -1.0])
    assert torch.equal(pooler.finish(cfg, pooler.accumulate(cfg, None, None, torch.zeros(4), logits, True), 5), logits)
    sig = pooler.read_pooling_config(_folder(tmp_path), "LlamaForSequenceClassification",
                                     {"sbert_ce_default_activation_function": "torch.nn.modules.activation.Sigmoid"})
    assert torch.allclose(pooler.finish(sig, logits, 5), torch.sigmoid(logits))


def test_chunks_accumulate_to_the_whole_prompt_pooling():
    torch.manual_seed(0)
    hidden = torch.randn(23, 6)
    for mode in ("mean", "cls", "last"):
        cfg = pooler.PoolingConfig(mode, normalize=True)
        state = None
        for start in range(0, 23, 5):
            chunk = hidden[start:start + 5]
            state = pooler.accumulate(cfg, state, chunk, chunk[-1], torch.zeros(1), start == 0)
        whole = {"mean": hidden.mean(0), "cls": hidden[0], "last": hidden[-1]}[mode]
        assert torch.allclose(pooler.finish(cfg, state, 23), torch.nn.functional.normalize(whole, dim=-1), atol=1e-6)
