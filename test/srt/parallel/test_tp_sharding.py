"""Tensor-parallel pieces that run in one process (issue 54): each layer's weight loader keeps
exactly its rank's slice (heads, vocabulary rows, MLP blocks; KV heads replicated when there are
fewer than ranks), the batch plan survives the msgpack codec and rebuilds the request rows a
follower's attention reads, and launch refuses what TP does not serve in one line."""

import contextlib
import re

import pytest
import torch

from sglang.srt.distributed import parallel_state
from sglang.srt.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding


@contextlib.contextmanager
def as_rank(rank, size):
    """Builds layers as rank `rank` of `size` (only the sharding; no collective runs here)."""
    saved = parallel_state._GROUP
    parallel_state._GROUP = parallel_state.TpGroup(rank, size, "gloo")
    try:
        yield
    finally:
        parallel_state._GROUP = saved


def test_qkv_splits_heads_and_replicates_scarce_kv_heads():
    head, heads, kv_heads = 4, 8, 2
    q = torch.arange(heads * head * 3, dtype=torch.float32).reshape(heads * head, 3)
    k = 1000 + torch.arange(kv_heads * head * 3, dtype=torch.float32).reshape(kv_heads * head, 3)
    v = -k
    for size in (2, 4):
        for rank in range(size):
            with as_rank(rank, size):
                layer = QKVParallelLinear(3, head, heads, kv_heads)
            for shard, t in (("q", q), ("k", k), ("v", v)):
                layer.weight_loader(layer.weight, t, shard)
            nq = heads // size
            assert layer.num_heads == nq and layer.num_kv_heads == max(1, kv_heads // size)
            w = layer.weight.data
            assert torch.equal(w[: nq * head], q[rank * nq * head:(rank + 1) * nq * head])
            kv_head = rank * kv_heads // size  # the KV head this rank's query heads use
            nkv = layer.num_kv_heads * head
            want_k = k[kv_head * head: kv_head * head + nkv] if size > kv_heads else k[rank * nkv:(rank + 1) * nkv]
            assert torch.equal(w[nq * head: nq * head + nkv], want_k), (size, rank)
            assert torch.equal(w[nq * head + nkv:], -want_k)


def test_fused_checkpoint_tensor_is_split_per_block():
    with as_rank(1, 2):
        layer = MergedColumnParallelLinear(2, [4, 4])
    fused = torch.arange(16, dtype=torch.float32).reshape(8, 2)  # gate rows 0-3, up rows 4-7
    layer.weight_loader(layer.weight, fused, None)
    assert torch.equal(layer.weight.data, torch.cat([fused[2:4], fused[6:8]]))


def test_column_and_row_parallel_slices():
    w = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    with as_rank(1, 2):
        col, row = ColumnParallelLinear(6, 4, bias=True), RowParallelLinear(6, 4, bias=True)
    col.weight_loader(col.weight, w)
    col.weight_loader(col.bias, torch.arange(4.0))
    row.weight_loader(row.weight, w)
    row.weight_loader(row.bias, torch.arange(4.0))
    assert torch.equal(col.weight.data, w[2:]) and torch.equal(col.bias.data, torch.tensor([2.0, 3.0]))
    assert torch.equal(row.weight.data, w[:, 3:]) and torch.equal(row.bias.data, torch.arange(4.0))
    with pytest.raises(ValueError, match="not divisible by --tp-size 4"):
        with as_rank(0, 4):
            ColumnParallelLinear(6, 6)


def test_vocab_rows_padded_per_rank():
    vocab, hidden = 5, 2
    w = torch.arange(vocab * hidden, dtype=torch.float32).reshape(vocab, hidden)
    with as_rank(1, 2):
        emb = VocabParallelEmbedding(vocab, hidden)
        head = ParallelLMHead(vocab, hidden, bias=True)
    emb.weight_loader(emb.weight, w)
    head.weight_loader(head.bias, torch.arange(5.0))
    assert (emb.vocab_start, emb.vocab_end) == (3, 5)
    assert torch.equal(emb.weight.data, torch.cat([w[3:], torch.zeros(1, hidden)]))
    assert torch.equal(head.bias.data, torch.tensor([3.0, 4.0, 0.0]))


def test_plan_round_trip_rebuilds_follower_rows(monkeypatch):
    monkeypatch.setenv("SGLANG_INTERNAL_SECRET", "s" * 32)
    import sglang.srt.managers.internal_channel as ic
    from sglang.srt.managers.tp_group_worker import decode_plan, encode_plan
    from sglang.srt.model_executor.forward_batch import ForwardBatch
    from sglang.srt.utils.msg_codec import WireError

    monkeypatch.setattr(ic, "_codec", None)  # read the secret now
    rank0 = torch.zeros(4, 16, dtype=torch.int64)
    rank0[2, :3] = torch.tensor([40, 41, 42])  # a cached prefix of 3 tokens in row 2
    out = torch.tensor([50, 51, 60, 61, 62])
    fb = ForwardBatch.for_extend([[7, 8], [9, 10, 11]], prefix_lens=[3, 0], req_pool_indices=[2, 1], out_cache_loc=out)
    fb.return_full_logits = True
    frame = encode_plan(fb, rank0)
    follower = torch.zeros(4, 16, dtype=torch.int64)
    got = decode_plan(frame, "cpu", follower)
    assert torch.equal(follower[2, :5], torch.tensor([40, 41, 42, 50, 51]))
    assert torch.equal(follower[1, :3], torch.tensor([60, 61, 62]))
    assert got.forward_mode == fb.forward_mode and got.return_full_logits
    assert torch.equal(got.input_ids, fb.input_ids) and got.extend_prefix_lens_cpu == [3, 0]

    dec = ForwardBatch.for_decode([5, 6], seq_lens=[6, 4], req_pool_indices=[2, 1], out_cache_loc=torch.tensor([70, 71]))
    decode_plan(encode_plan(dec, rank0), "cpu", follower)
    assert int(follower[2, 5]) == 70 and int(follower[1, 3]) == 71
    tampered = bytearray(frame)
    tampered[-1] ^= 1
    with pytest.raises(WireError):
        decode_plan(bytes(tampered), "cpu", follower)


@pytest.mark.parametrize("arch,tp,message", [
    ("gemma", 2, "GemmaForCausalLM is not tensor-parallel in this build"),
    ("qwen3_swa", 2, "hybrid SWA pools"),
    ("llama", 3, "does not divide the model's num_attention_heads (4)"),
])
def test_launch_refuses_what_tp_does_not_serve(arch, tp, message, tmp_path):
    from sglang.srt.model_loader.loader import ModelConfigError, check_tp_servable
    from sglang.test.tiny_models import make_tiny_model

    model = make_tiny_model(str(tmp_path / arch), arch)
    check_tp_servable(model, 1)
    with pytest.raises(ModelConfigError, match=re.escape(message)):
        check_tp_servable(model, tp)


@pytest.mark.parametrize("kwargs,message", [
    (dict(tp_size=2, nnodes=2), "--nnodes > 1 needs --dist-init-addr"),
    (dict(tp_size=3, nnodes=2, dist_init_addr="127.0.0.1:5000"), "must be a multiple of --nnodes 2"),
    (dict(tp_size=2, nnodes=2, node_rank=2, dist_init_addr="127.0.0.1:5000"), "--node-rank 2 is not in"),
    (dict(tp_size=2, dist_init_addr="127.0.0.1"), "Missing port"),
    (dict(tp_size=2, disaggregation_mode="prefill"), "is not supported yet"),
    (dict(tp_size=2, dp_size=2), "--tp-size 2 with --dp-size 2 is not supported yet"),
])
def test_server_args_refuse_bad_layouts(kwargs, message):
    from sglang.srt.server_args import ServerArgs

    with pytest.raises(ValueError, match=message):
        ServerArgs(model_path="x", **kwargs)


def test_core_groups_from_env_and_even_split():
    from sglang.srt.utils.cpu_binding import available_cores, format_cores, tp_core_groups

    cores = available_cores()
    spec = "|".join(str(c) for c in cores[:2]) if len(cores) >= 2 else f"{cores[0]}|{cores[0]}"
    assert tp_core_groups(2, spec) == [[int(x)] for x in spec.split("|")]
    even = tp_core_groups(2, "")
    assert len(even) == 2 and all(even) and (len(cores) < 2 or not set(even[0]) & set(even[1]))
    assert tp_core_groups(1, "") == [None]
    with pytest.raises(ValueError, match="rank 1 has none"):
        tp_core_groups(2, format_cores(cores))
