"""Serving a TTEmbeddingBagCollection from one hot-row cache: equal to the per-table lookup, never stale."""

from __future__ import annotations

import pytest
import torch

torchrec = pytest.importorskip("torchrec")
from torchrec import EmbeddingBagConfig, KeyedJaggedTensor, PoolingType  # noqa: E402

from comera_lightning import TTEmbeddingBagCollection  # noqa: E402
from tests.layers.test_hot_rows import zipf_ids  # noqa: E402

SIZES = {"big": 60_000, "mid": 9_000, "small": 300, "tiny": 7}


def collection(**kwargs) -> TTEmbeddingBagCollection:
    """Two large TT tables (partly cached), one TT table that fits its cache, two small dense ones; SUM and MEAN."""
    tables = [
        EmbeddingBagConfig(name=name, embedding_dim=8, num_embeddings=rows, feature_names=[f"f_{name}"],
                           pooling=PoolingType.MEAN if name == "mid" else PoolingType.SUM)
        for name, rows in SIZES.items()
    ] + [EmbeddingBagConfig(name="big2", embedding_dim=8, num_embeddings=80_000, feature_names=["f_big2", "f_big2b"])]
    torch.manual_seed(0)
    return TTEmbeddingBagCollection(tables, max_rank=6, num_cores=3, min_rows=100, cache_rows=1_500, dtype=torch.float64, **kwargs)


def batch(size: int, seed: int, length: int | None = None) -> KeyedJaggedTensor:
    """Zipf ids per feature; bags of ``length`` ids, or of 0-3 ids (jagged, some empty)."""
    rows = {**{f"f_{name}": n for name, n in SIZES.items()}, "f_big2": 80_000, "f_big2b": 80_000}
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.full((len(rows) * size,), length) if length is not None else torch.randint(0, 4, (len(rows) * size,), generator=generator)
    values = [zipf_ids(int(lengths[i * size:(i + 1) * size].sum()), n, seed + i) for i, n in enumerate(rows.values())]
    return KeyedJaggedTensor.from_lengths_sync(keys=list(rows), values=torch.cat(values), lengths=lengths)


def trained(ebc: TTEmbeddingBagCollection) -> TTEmbeddingBagCollection:
    for seed in range(4):
        ebc(batch(256, seed)).values().sum().backward()
    return ebc.eval()


def per_table(ebc: TTEmbeddingBagCollection, kjt: KeyedJaggedTensor) -> torch.Tensor:
    with torch.enable_grad():  # autograd on: every table contracted from its cores, nothing cached
        return ebc(kjt).values().detach()


@pytest.mark.parametrize("length", [None, 1, 3])
def test_served_output_equals_the_per_table_lookup(length):
    ebc = trained(collection())
    kjt = batch(64, 100, length)
    with torch.no_grad():
        served = ebc(kjt).values()
    assert "_collection_cache" in ebc.__dict__, "the whole-collection path served this batch"
    torch.testing.assert_close(served, per_table(ebc, kjt), rtol=0, atol=1e-12)
    torch.testing.assert_close(served.float(), ebc.to_ebc()(kjt).values(), rtol=1e-5, atol=1e-6)  # TorchRec casts to float32


@pytest.mark.parametrize("dim, rank, transposed", [(8, 6, True), (64, 12, False), (64, 4, True)])
def test_misses_are_exact_with_the_right_half_tables_in_either_layout(dim, rank, transposed):
    """Narrow right rows or tiny products: right half tables stored transposed; wide ones (M_R = 16, rank 12) as they are."""
    names = ["a", "b"]
    tables = [EmbeddingBagConfig(name=n, embedding_dim=dim, num_embeddings=50_000, feature_names=[f"f_{n}"]) for n in names]
    torch.manual_seed(0)
    ebc = TTEmbeddingBagCollection(tables, max_rank=rank, num_cores=3, min_rows=100, cache_rows=500, dtype=torch.float64)

    def kjt_of(seed: int) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{n}" for n in names], lengths=torch.ones(600, dtype=torch.long),
                                                   values=torch.cat([zipf_ids(300, 50_000, seed + i) for i in range(2)]))

    ebc.count_ids(kjt_of(0))
    ebc.eval()
    kjt = kjt_of(5)  # other ids than were counted: hot rows and misses
    with torch.no_grad():
        served = ebc(kjt).values()
    assert ebc.__dict__["_collection_cache"].stacked.transposed is transposed
    torch.testing.assert_close(served, per_table(ebc, kjt), rtol=0, atol=1e-12)


def test_served_rows_follow_every_change_of_the_tables():
    ebc = trained(collection())
    kjt = batch(64, 7)
    with torch.no_grad():
        ebc(kjt)
        ebc.embedding_bags["big"].cores[0].mul_(2.0)  # in place, as an optimizer step in eval mode
        ebc.embedding_bags["tiny"].weight.add_(1.0)
        torch.testing.assert_close(ebc(kjt).values(), per_table(ebc, kjt), rtol=0, atol=1e-12)


def test_counting_from_data_raises_the_hit_rate_and_memory_stays_small():
    ebc = collection().eval()
    kjt = batch(512, 3, length=1)
    ebc.count_ids(kjt)
    with torch.no_grad():
        ebc(kjt)
    cache = ebc.__dict__["_collection_cache"]
    keys = torch.cat([v.values() + int(cache.key_base[t]) for t, v in ((0, kjt["f_big"]), (4, kjt["f_big2"]))])
    assert cache.index.find(keys)[1].float().mean() > 0.5
    dense_bytes = sum(c.num_embeddings * c.embedding_dim * 8 for c in ebc.embedding_bag_configs())
    assert ebc.inference_bytes() < dense_bytes / 3


def test_bad_ids_and_unusual_inputs_take_the_checked_path():
    ebc = trained(collection())
    kjt = batch(16, 5, length=1)
    values = kjt.values().clone()
    values[0] = SIZES["big"]
    bad = KeyedJaggedTensor.from_lengths_sync(keys=kjt.keys(), values=values, lengths=kjt.lengths())
    with torch.no_grad(), pytest.raises(IndexError, match="out of range for table 'big'"):
        ebc(bad)
    values = kjt.values().clone()
    values[16 * 3] = -2  # feature f_tiny, in the common layout (one id per bag)
    negative = KeyedJaggedTensor.from_lengths_sync(keys=kjt.keys(), values=values, lengths=kjt.lengths())
    with torch.no_grad(), pytest.raises(IndexError, match="id -2 of feature 'f_tiny' is out of range"):
        ebc(negative)
    reordered = KeyedJaggedTensor.from_jt_dict({k: kjt[k] for k in reversed(kjt.keys())})
    with torch.no_grad():
        torch.testing.assert_close(ebc(reordered).values(), per_table(ebc, kjt), rtol=0, atol=1e-12)


def test_a_collection_that_counted_nothing_and_a_changed_threshold_serve_exact_rows():
    ebc = collection().eval()
    kjt = batch(32, 8, length=2)
    with torch.no_grad():
        torch.testing.assert_close(ebc(kjt).values(), per_table(ebc, kjt), rtol=0, atol=1e-12)
        ebc.embedding_bags["big"].gate_threshold = 0.9  # gates at 1.0 stay live, but the key must notice
        ebc.embedding_bags["big"].gates[0][:3] = 0.5  # below the new threshold: dead
        torch.testing.assert_close(ebc(kjt).values(), per_table(ebc, kjt), rtol=0, atol=1e-12)
