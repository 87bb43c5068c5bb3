"""The NGRAM drafter (suffix match over the request's own tokens) and the memory manager's trim of
rejected drafts' KV (whole pages back to the allocator, the page in use kept)."""

import torch

from sglang.srt.speculative.ngram_drafter import NgramDrafter, NgramIndex


def _propose(tokens, k, depth=18):
    return NgramDrafter(depth).propose(tokens, NgramIndex(), k)


def test_latest_occurrence_of_the_longest_suffix():
    # "7 8 9" occurs twice; its latest occurrence is followed by 4 5
    tokens = [7, 8, 9, 1, 2, 0, 7, 8, 9, 4, 5, 6, 3, 7, 8, 9]
    assert _propose(tokens, 2) == [4, 5]
    # a longer match wins over a more recent shorter one: "1 7 8" matches only at the start
    tokens = [1, 7, 8, 5, 5, 5, 7, 8, 6, 1, 7, 8]
    assert _propose(tokens, 2) == [5, 5]


def test_no_match_no_draft_and_single_token_matches_are_not_used():
    assert _propose([1, 2, 3, 4, 5], 4) == []
    assert _propose([1, 2, 3, 1], 4) == []  # only a one-token suffix occurred before
    assert _propose([5], 4) == []
    assert _propose([1, 2, 1, 2], 0) == []


def test_copy_runs_over_its_own_draft_for_cycles():
    # period 2: the latest earlier "1 2" ends one cycle back; the copy continues the cycle
    assert _propose([3, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]
    assert _propose([4, 4, 4], 6) == [4, 4, 4, 4, 4, 4]


def test_trie_depth_bounds_match_plus_draft():
    tokens = list(range(10)) + [0, 1, 2, 3]
    assert _propose(tokens, 10, depth=6) == [4, 5]  # 4-token match + 2
    assert len(_propose(tokens, 10, depth=18)) == 10


def test_index_is_incremental():
    index, drafter = NgramIndex(), NgramDrafter()
    tokens = [5, 6, 7, 8]
    assert drafter.propose(tokens, index, 3) == []
    tokens += [5, 6]
    assert drafter.propose(tokens, index, 3) == [7, 8, 5]
    assert index.indexed == len(tokens) - 1


def test_trim_kv_gives_back_whole_pages_only(tmp_path):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.configs.runtime_config import MemoryConfig
    from sglang.srt.core.req import Req
    from sglang.srt.mem_cache.memory_manager import MemoryManager
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.test.tiny_models import make_tiny_model

    model = ModelConfig.from_path(make_tiny_model(str(tmp_path / "m"), "llama"))
    config = MemoryConfig(max_total_tokens=64, page_size=4, max_running_requests=2)
    mm = MemoryManager(model, config, kv_dtype=torch.float32, model_dtype=torch.float32)
    free0 = mm.allocator.available_size()
    req = Req("r", None, [1] * 5, SamplingParams())
    assert mm.reserve([req], [0], [5]) is not None  # 2 pages
    assert mm.allocator.available_size() == free0 - 8
    mm.reserve_verify([req], [7])  # positions 5..11: the rest of page 2 and page 3
    assert req.kv.kv_len == 12 and mm.allocator.available_size() == free0 - 12
    mm.trim_kv(req, 9)  # tokens 0..8 stay: page 3 (positions 8..11) is still in use
    assert req.kv.kv_len == 9 and mm.allocator.available_size() == free0 - 12
    mm.trim_kv(req, 6)  # page 3 goes back, page 2 (positions 4..7) stays
    assert req.kv.kv_len == 6 and mm.allocator.available_size() == free0 - 8
    slots = mm.reserve_decode([req])  # the next token continues inside page 2
    assert int(slots[0]) == int(mm.req_to_token_pool.req_to_token[req.kv.req_pool_idx, 5]) + 1
    assert mm.allocator.available_size() == free0 - 8
