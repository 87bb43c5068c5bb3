"""The scheduler's memory setup (`managers/scheduler_memory.py`): a PD decode server resolves its
retraction backup before the radix tree is built, so the tree's builder (the registry, and a
registered backend) sees the backup the server really runs with, also when it was left to the
automatic rule; the store is built from the same decision."""

import dataclasses

import pytest

from sglang.srt.mem_cache.registry import (
    _unregister_radix_cache_backend,
    create_tree_cache,
    register_radix_cache_backend,
)
from sglang.test.scheduler_utils import make_scheduler
from sglang.test.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("tiny_llama")), "llama", seed=1)


@pytest.fixture
def spy_backend():
    """A registered backend that records what it is built with, then builds the default tree."""
    seen = []

    def factory(ctx):
        seen.append(ctx)
        default = dataclasses.replace(ctx, cache_config=dataclasses.replace(ctx.cache_config, radix_cache_backend=None))
        return create_tree_cache(default)

    register_radix_cache_backend("spy-test", factory)
    yield seen
    _unregister_radix_cache_backend("spy-test")


@pytest.mark.parametrize("given", [None, "cpu_tensor", "host_pool"])
def test_tree_builder_sees_the_resolved_retraction_backup(model_dir, spy_backend, given):
    extra = {} if given is None else dict(disaggregation_decode_retraction_backup=given)
    sched = make_scheduler(model_dir, max_total_tokens=512, page_size=1, disaggregation_mode="decode",
                           disaggregation_transfer_backend="fake", radix_cache_backend="spy-test", **extra)
    expected = given or "host_pool"  # the automatic rule: a dense model's PD decode server
    assert [ctx.retraction_backup for ctx in spy_backend] == [expected]
    store = sched.memory.retraction_store
    assert (store.host_pool is not None) == (expected == "host_pool")
    assert sched.server_args.disaggregation_decode_retraction_backup == expected


def test_plain_server_has_no_retraction_store(model_dir, spy_backend):
    sched = make_scheduler(model_dir, max_total_tokens=512, radix_cache_backend="spy-test")
    assert len(spy_backend) == 1 and sched.memory.retraction_store is None
