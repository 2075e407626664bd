"""KV offload tiers end to end (issue 37), CPU fp32: blocks and state checkpoints evicted from
a small device pool are written to the host, disk or Redis tier and loaded back by a later
request sharing the prefix. Oracle: the same request run cold (prefix caching off): greedy
tokens equal and top-5 logprobs within 1e-6. Conservation (I4) at the end of every run."""

from __future__ import annotations

import pytest

from hyla.request import SamplingParams
from tests.engine.engine_util import (
    assert_i4,
    assert_same_completion,
    load,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
    save_checkpoint,
)
from tests.redis_server import redis_server, silent_server

FAMILIES = ("kimi_linear", "deepseek_v32")  # KDA + MLA; DSA only
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=5)
ATOL = 1e-6
DOC = 200  # tokens of the shared document
SMALL = dict(num_blocks=40, state_checkpoint_stride=32, max_num_batched_tokens=512)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    loaded = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        save_checkpoint(family, path)
        loaded[family] = load(path)
    return loaded


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


def cold(model, prompt):
    engine = make_engine(model, enable_prefix_caching=False)
    engine.add_request("cold", prompt, PARAMS)
    return run_all(engine)["cold"]


def run(engine, rid, prompt):
    engine.add_request(rid, prompt, PARAMS)
    return run_all(engine)[rid]


def evict_document(engine, doc):
    """Run the document, then prompts that take every device block: its blocks go down."""
    run(engine, "doc", doc)
    for k in range(3):
        run(engine, f"filler{k}", prompt_ids(300, seed=900 + k))
    pool = engine.cache.block_pool
    from hyla.cache.prefix import extend_block_hashes

    hashes = extend_block_hashes([], doc, engine.cache.block_size)
    assert all(pool.lookup(h) is None for h in hashes), "the document is still on the device"


def tier_options(kind, tmp_path, redis_url=None):
    if kind == "host":
        return dict(kv_offload_host_gib=0.05)
    if kind == "disk":
        return dict(kv_offload_disk_gib=0.05, kv_offload_disk_dir=str(tmp_path / "kv"))
    return dict(kv_offload_remote_url=redis_url)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["host", "disk", "remote"])
def test_evicted_prefix_comes_back_from_the_tier(models, family, kind, tmp_path, request):
    url = request.getfixturevalue("redis_url") if kind == "remote" else None
    model = models[family]
    doc = prompt_ids(DOC, seed=37)
    query = doc + prompt_ids(20, seed=38)
    engine = make_engine(model, **SMALL, **tier_options(kind, tmp_path, url))
    evict_document(engine, doc)
    out = run(engine, "query", query)
    # the deepest pair at or below the document: a stride (192) or its tail checkpoint (192)
    assert out.num_cached_tokens == DOC // 16 * 16 if family == "deepseek_v32" else 192
    assert engine.cache.tiers.stats.num_loads == 1
    assert_same_completion(out, cold(model, query), atol=ATOL)
    assert_i4(engine)
