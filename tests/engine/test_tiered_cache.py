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
SMALL = dict(
    num_blocks=30, max_model_len=320, state_checkpoint_stride=32, max_num_batched_tokens=512
)


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
    for k in range(2):
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


def doc_hashes(engine, doc):
    from hyla.cache.prefix import extend_block_hashes

    return extend_block_hashes([], doc, engine.cache.block_size)


@pytest.mark.parametrize("family", FAMILIES)
def test_second_engine_serves_a_document_the_first_computed(models, family, redis_url):
    """Two engines with separate caches on one Redis: B's first request hits what A pinned."""
    from hyla.engine.documents import pin_document

    model = models[family]
    doc = prompt_ids(DOC, seed=41)
    query = doc + prompt_ids(20, seed=42)
    a = make_engine(model, **{**SMALL, "num_blocks": 40}, kv_offload_remote_url=redis_url)
    b = make_engine(model, **SMALL, kv_offload_remote_url=redis_url)
    pinned = pin_document(a, "manual", doc)
    assert pinned.num_tokens == DOC // 16 * 16
    out = run(b, "query", query)
    assert out.num_cached_tokens == pinned.num_tokens
    assert b.cache.tiers.stats.num_loads == 1
    assert_same_completion(out, cold(model, query), atol=ATOL)
    assert_i4(b)
    assert a.cache.documents.unpin("manual")
    assert_i4(a)


@pytest.mark.parametrize("store", ["down", "silent"])
def test_store_down_or_slow_recomputes(models, store, tmp_path):
    from tests.redis_server import free_port

    model = models["kimi_linear"]
    doc = prompt_ids(DOC, seed=43)
    query = doc + prompt_ids(20, seed=44)
    with silent_server() as silent:
        url = silent if store == "silent" else f"redis://127.0.0.1:{free_port()}/0"
        engine = make_engine(model, **SMALL, kv_offload_remote_url=url,
                             kv_offload_remote_timeout=0.05)  # fmt: skip
        evict_document(engine, doc)
        out = run(engine, "query", query)
    assert out.num_cached_tokens == 0
    assert engine.cache.tiers.tiers[0].stats.num_errors >= 1
    assert_same_completion(out, cold(model, query), atol=ATOL)
    assert_i4(engine)


@pytest.mark.parametrize("kind", ["disk", "remote"])
def test_corrupted_checkpoint_is_dropped_and_a_shallower_pair_used(models, kind, tmp_path,
                                                                   request):  # fmt: skip
    url = request.getfixturevalue("redis_url") if kind == "remote" else None
    model = models["kimi_linear"]
    doc = prompt_ids(DOC, seed=45)
    query = doc + prompt_ids(20, seed=46)
    engine = make_engine(model, **SMALL, **tier_options(kind, tmp_path, url))
    evict_document(engine, doc)
    tiers = engine.cache.tiers
    key = tiers.checkpoint_key(doc_hashes(engine, doc)[192 // 16 - 1])
    store = tiers.tiers[0]
    if kind == "disk":
        path = store._path(key)
        frame = bytearray(path.read_bytes())
        frame[-1] ^= 0xFF
        path.write_bytes(bytes(frame))
    else:
        import redis

        client = redis.Redis.from_url(url)
        frame = bytearray(client.get(key))
        frame[len(frame) // 2] ^= 0x01
        client.set(key, bytes(frame))
    out = run(engine, "query", query)
    assert out.num_cached_tokens == 160  # the stride before the corrupted checkpoint
    assert store.stats.num_corrupt == 1
    assert store.contains_many([key]) == [False]  # dropped
    assert_same_completion(out, cold(model, query), atol=ATOL)
    assert_i4(engine)


def test_pinned_document_is_never_evicted(models):
    from hyla.engine.documents import pin_document

    model = models["kimi_linear"]
    doc = prompt_ids(DOC, seed=47)
    engine = make_engine(model, **{**SMALL, "num_blocks": 40})
    pinned = pin_document(engine, "d", doc)
    for k in range(3):
        run(engine, f"filler{k}", prompt_ids(300, seed=900 + k))
    hashes = doc_hashes(engine, doc)[: pinned.num_tokens // 16]
    assert all(engine.cache.block_pool.lookup(h) is not None for h in hashes)
    query = doc + prompt_ids(20, seed=48)
    out = run(engine, "query", query)
    assert out.num_cached_tokens == pinned.num_tokens
    assert_same_completion(out, cold(model, query), atol=ATOL)
    stats = engine.get_stats().tier_stats
    assert stats["documents_pinned"] == 1 and stats["documents_pinned_tokens"] == 192
    assert engine.cache.documents.unpin("d")
    assert_i4(engine)
