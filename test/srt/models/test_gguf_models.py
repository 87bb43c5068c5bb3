"""GGUF files served in their blocks against HF transformers loading the same file with
`gguf_file=` (which dequantizes every weight to fp32): the packaged default model from its Q4_1
file (Q8_0 tied embedding), and tiny random llamas whose projections mix the K-quants and the
legacy types per tensor, as Q4_K_M files do.

Stated tolerances (fp32 activations on both sides, the same dequantized weight values, sums in
a different order): first-step logits within 2e-2 absolute of HF's on the default model (logits
of magnitude ~20; measured max 1.3e-4 here), 1e-3 on the tiny models; greedy tokens equal on at
least 4 of the 5 prompts (all 5 here)."""

import os

import pytest
import torch

from sglang.srt.configs.gguf_file import GGUFError, gguf_config_dict, read_header, split_gguf_path
from sglang.test.gguf_files import write_tiny_llama_gguf

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "How many legs does a spider have?",
    "Say hello in Spanish.",
]
NEW_TOKENS = 8


def _hf_model(path):
    from transformers import AutoModelForCausalLM

    folder, name = split_gguf_path(path)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def _runner(path, dtype="float32"):
    from sglang.srt.model_executor.model_runner import ModelRunner

    return ModelRunner(path, max_total_tokens=1024, max_running_requests=2, disable_tqdm=True, dtype=dtype)


def _first_logits(runner, ids):
    from sglang.test.runner_utils import ManualDriver

    drv = ManualDriver(runner)
    req = drv.new_request(ids)
    try:
        return drv.extend([req], [list(ids)], return_full_logits=True).full_logits.float()
    finally:
        drv.free(req)


def _hf_greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def default_pair():
    from sglang.srt.model_loader.default_model import default_gguf_path

    path = default_gguf_path()
    return path, _runner(path), _hf_model(path)


def test_default_model_is_served_from_its_gguf_file(default_pair):
    path, runner, _ = default_pair
    assert runner.model_config.model_path == path and path.endswith(".Q4_1.gguf")
    lm = runner.model
    qkv = lm.model.layers[0].self_attn.qkv_proj
    assert qkv.gguf_weight.type_names() == ["Q4_1"] and qkv.weight.stride() == (0, 0)  # no dense copy
    assert lm.model.embed_tokens.gguf_weight.type_names() == ["Q8_0"]
    assert lm.lm_head.gguf_weight is lm.model.embed_tokens.gguf_weight  # tied, in its blocks
    blocks = sum(m.gguf_weight.nbytes() for m in lm.modules()
                 if getattr(m, "gguf_weight", None) is not None and m is not lm.lm_head)
    assert blocks < 0.6 * 134.5e6 * 2  # under 60% of bf16's bytes (Q4_1 + a Q8_0 embedding)


def test_default_model_matches_transformers_on_the_same_file(default_pair):
    from sglang.srt.managers.tokenizer_loading import load_tokenizer

    path, runner, hf = default_pair

    class Args:
        tokenizer_path, model_path, trust_remote_code, tokenizer_mode = None, "default", False, "auto"
        load_format = "gguf"  # "default" with --load-format gguf: the shipped file

    tok = load_tokenizer(Args())
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    from transformers import AutoTokenizer

    from sglang.test.runner_utils import greedy_generate

    folder, name = split_gguf_path(path)
    hf_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)  # what upstream loads
    text = "<|im_start|>user\nÜnïcode 日本 123  spaces\t tab<|im_end|>"
    assert tok(text).input_ids == hf_tok(text).input_ids and tok.chat_template == hf_tok.chat_template
    assert tok.all_special_ids == hf_tok.all_special_ids and len(tok) == len(hf_tok)

    same, worst = 0, 0.0
    for prompt in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        ids = ids if isinstance(ids, list) else ids["input_ids"]
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        got = _first_logits(runner, ids)
        worst = max(worst, float((got - ref).abs().max()))
        same += greedy_generate(runner, ids, NEW_TOKENS) == _hf_greedy(hf, ids, NEW_TOKENS)
    print(f"default model vs transformers: logits max diff {worst:.2e}, greedy equal on {same}/{len(PROMPTS)}")
    assert worst < 2e-2
    assert same >= 4


MIXES = {
    "k_quants_mixed_per_tensor": dict(types={"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q3_K",
                                              "ffn_gate": "Q5_K", "ffn_up": "Q2_K", "ffn_down": "Q6_K"},
                                       embed_type="Q6_K", output_type="Q6_K"),
    "legacy_types_tied_head": dict(types={"attn_q": "Q8_0", "attn_k": "Q5_0", "attn_v": "Q5_1", "attn_output": "Q4_1",
                                           "ffn_gate": "Q4_0", "ffn_up": "F16", "ffn_down": "Q8_0"},
                                    embed_type="Q4_1", output_type=None),
}


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_tiny_llama_with_mixed_types_matches_transformers(tmp_path, mix):
    path = write_tiny_llama_gguf(str(tmp_path / f"{mix}.gguf"), seed=len(mix), **MIXES[mix])
    runner, hf = _runner(path), _hf_model(path)
    ids = [1, 17, 300, 42, 9, 511, 2, 77]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    got = _first_logits(runner, ids)
    torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-3)
    from sglang.test.runner_utils import greedy_generate

    assert greedy_generate(runner, ids, 8) == _hf_greedy(hf, ids, 8)


def test_bad_files_stop_with_one_line_naming_the_problem(tmp_path):
    path = write_tiny_llama_gguf(str(tmp_path / "t.gguf"), {})
    with open(path, "rb") as f:
        data = f.read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-1000])
    with pytest.raises(GGUFError, match=r"is truncated: tensor output\.weight ends at byte"):
        read_header(str(cut))
    # an IQ type (ggml type 20, IQ4_NL) in place of the first tensor's Q8_0
    header = read_header(path)
    first = header.tensors[0]
    name = first.name.encode()
    at = data.index(name + (2).to_bytes(4, "little"))  # name, n_dims=2
    type_at = at + len(name) + 4 + 8 * 2
    bad = bytearray(data)
    bad[type_at:type_at + 4] = (20).to_bytes(4, "little")
    iq = tmp_path / "iq.gguf"
    iq.write_bytes(bytes(bad))
    with pytest.raises(GGUFError, match=r"GGUF tensor token_embd\.weight has type IQ4_NL, which is not supported"):
        read_header(str(iq))
    from sglang.srt.model_loader.loader import ModelConfigError, check_model_servable

    with pytest.raises(ModelConfigError, match="IQ4_NL"):  # what start-up runs before spawning anything
        check_model_servable(str(iq))
    other = bytearray(data)
    i = data.index(b"llama")
    other[i:i + 5] = b"gpt2x"[:5]
    arch = tmp_path / "arch.gguf"
    arch.write_bytes(bytes(other))
    with pytest.raises(GGUFError, match="has architecture 'gpt2x'"):
        gguf_config_dict(str(arch))


def test_load_format_acts_and_refuses_what_it_cannot_read(tmp_path):
    from sglang.srt.server_args import prepare_server_args

    path = write_tiny_llama_gguf(str(tmp_path / "t.gguf"), {})
    assert prepare_server_args(["--model-path", path, "--load-format", "gguf"]).load_format == "gguf"
    assert prepare_server_args(["--model-path", path]).load_format == "auto"
    for argv, message in (
        (["--model-path", str(tmp_path), "--load-format", "gguf"], "needs a GGUF file as --model-path"),
        (["--model-path", path, "--load-format", "safetensors"], "it is a GGUF file"),
        (["--model-path", path, "--load-format", "dummy"], "--load-format dummy is not supported by this server"),
    ):
        with pytest.raises(ValueError, match=message):
            prepare_server_args(argv)
