import subprocess
import sys

import pytest
import torch
from torch import nn

torchrec = pytest.importorskip("torchrec")
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType  # noqa: E402
from torchrec.models.dlrm import DLRM  # noqa: E402

from comera_lightning import TensorizeConfig, TTEmbedding, TTEmbeddingBagCollection, tensorize, to_dense  # noqa: E402
from comera_lightning.checkpoint import restore_tensorized  # noqa: E402
from comera_lightning.tensorize.build import pin_trained_tables  # noqa: E402

FULL_RANK = 10**6


def make_tables(pooling_big: PoolingType = PoolingType.SUM) -> list[EmbeddingBagConfig]:
    """A TT table shared by two features, a MEAN TT table, and a small dense table sharing feature "c"."""
    return [
        EmbeddingBagConfig(name="t_big", embedding_dim=12, num_embeddings=1500, feature_names=["a", "b"], pooling=pooling_big),
        EmbeddingBagConfig(name="t_mean", embedding_dim=8, num_embeddings=2000, feature_names=["c"], pooling=PoolingType.MEAN),
        EmbeddingBagConfig(name="t_small", embedding_dim=4, num_embeddings=40, feature_names=["d", "c"], pooling=PoolingType.MEAN),
    ]


def make_kjt(batch: int = 7, weighted: bool = False, high: dict[str, int] | None = None) -> KeyedJaggedTensor:
    """Jagged input with empty bags, repeated ids, keys in an odd order and an unused key."""
    high = high or {"d": 40, "c": 40, "b": 1500, "a": 1500, "z": 5}
    values, lengths = [], []
    for key, top in high.items():
        lens = torch.randint(0, 5, (batch,))
        lens[0], lens[1] = 2, 0  # an empty bag in every feature
        ids = torch.randint(0, top, (int(lens.sum()),))
        if ids.numel() > 2:
            ids[1] = ids[0]
        values.append(ids)
        lengths.append(lens)
    values = torch.cat(values)
    weights = torch.rand(values.numel(), dtype=torch.float64) if weighted else None
    return KeyedJaggedTensor(keys=list(high), values=values, lengths=torch.cat(lengths), weights=weights)


def reference(ebc: EmbeddingBagCollection, kjt: KeyedJaggedTensor) -> torch.Tensor:
    """What EmbeddingBagCollection computes, without its cast to float32."""
    features, outs = kjt.to_dict(), []
    for config in ebc.embedding_bag_configs():
        bag = ebc.embedding_bags[config.name]
        for name in config.feature_names:
            f = features[name]
            outs.append(bag(f.values(), f.offsets(), per_sample_weights=f.weights() if ebc.is_weighted() else None))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("num_cores", [2, 3])
@pytest.mark.parametrize("dedup", [True, False])
def test_full_rank_matches_ebc_exactly(num_cores, dedup):
    ebc = EmbeddingBagCollection(make_tables()).double()
    ours = TTEmbeddingBagCollection.from_ebc(ebc, max_rank=FULL_RANK, num_cores=num_cores, deduplicate=dedup)
    assert sorted(ours.tt_tables()) == ["t_big", "t_mean"] and isinstance(ours.embedding_bags["t_small"], nn.Embedding)
    kjt = make_kjt()
    expected, got = ebc(kjt), ours(kjt)
    assert got.keys() == expected.keys() == ["a", "b", "c@t_mean", "d", "c@t_small"]
    assert got.length_per_key() == expected.length_per_key() == [12, 12, 8, 4, 4]
    assert got.values().dtype == torch.float64
    torch.testing.assert_close(got.values(), reference(ebc, kjt), atol=1e-10, rtol=0)
    torch.testing.assert_close(got.values().float(), expected.values())
    assert got.values()[1].abs().sum() == 0  # empty bags pool to zero, also for MEAN (not NaN)


def test_weighted_input_matches_ebc():
    ebc = EmbeddingBagCollection(make_tables()[:1], is_weighted=True).double()
    ours = TTEmbeddingBagCollection.from_ebc(ebc, max_rank=FULL_RANK)
    assert ours.is_weighted()
    kjt = make_kjt(weighted=True, high={"b": 1500, "a": 1500})
    torch.testing.assert_close(ours(kjt).values(), reference(ebc, kjt), atol=1e-10, rtol=0)
    unweighted = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths())
    with pytest.raises(ValueError, match="no weights"):
        ours(unweighted)


def test_weighted_mean_divides_the_weighted_sum_by_bag_length():
    tables = {p: make_tables(pooling_big=p)[:1] for p in (PoolingType.SUM, PoolingType.MEAN)}
    summed = TTEmbeddingBagCollection(tables[PoolingType.SUM], max_rank=4, is_weighted=True, dtype=torch.float64)
    mean = TTEmbeddingBagCollection(tables[PoolingType.MEAN], max_rank=4, is_weighted=True, dtype=torch.float64)
    mean.load_state_dict(summed.state_dict())
    kjt = make_kjt(weighted=True, high={"a": 1500, "b": 1500})
    lengths = kjt.lengths().view(2, -1).T.repeat_interleave(12, dim=1).clamp(min=1)
    torch.testing.assert_close(mean(kjt).values(), summed(kjt).values() / lengths)


def test_variable_batch_per_feature_uses_inverse_indices_like_ebc():
    tables = [EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=1200, feature_names=["a"]),
              EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=50, feature_names=["b"])]
    ebc = EmbeddingBagCollection(tables)
    kjt = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2, 3, 4, 5]), lengths=torch.tensor([1, 2, 1, 0, 1]),
        stride_per_key_per_rank=[[2], [3]], inverse_indices=(["a", "b"], torch.tensor([[0, 1, 1, 0], [2, 1, 0, 0]])),
    )
    ours = TTEmbeddingBagCollection.from_ebc(ebc, max_rank=FULL_RANK)
    torch.testing.assert_close(ours(kjt).values(), ebc(kjt).values())


def test_a_batch_without_any_id_pools_zeros_and_keeps_the_cores_in_the_graph():
    ours = TTEmbeddingBagCollection(make_tables()[1:2], max_rank=4)
    empty = KeyedJaggedTensor(keys=["c"], values=torch.tensor([], dtype=torch.int32), lengths=torch.zeros(3, dtype=torch.int32))
    out = ours(empty).values()
    assert out.shape == (3, 8) and out.abs().sum() == 0
    out.sum().backward()
    assert all(p.grad is not None for p in ours.parameters())


def test_gradients_reach_every_core_gate_and_dense_table():
    ours = TTEmbeddingBagCollection(make_tables(), max_rank=5)
    ours(make_kjt(batch=16)).values().square().sum().backward()
    for name, p in ours.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_out_of_range_ids_name_table_feature_and_id():
    ours = TTEmbeddingBagCollection(make_tables(), max_rank=4)
    with pytest.raises(IndexError, match=r"id 1500 of feature 'b' is out of range for table 't_big' with 1500 rows"):
        ours(_with_id(make_kjt(), "b", 1500))
    with pytest.raises(IndexError, match=r"id -3 of feature 'c' is out of range for table 't_mean'"):
        ours(_with_id(make_kjt(), "c", -3))
    with pytest.raises(IndexError, match=r"id 40 of feature 'c' is out of range for table 't_small'"):
        ours(_with_id(make_kjt(), "c", 40))  # fine for t_mean, too big for the small table sharing "c"
    with pytest.raises(ValueError, match=r"features \['d'\] are missing"):
        ours(KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.tensor([1]), lengths=torch.tensor([1, 0, 0])))


def _with_id(kjt: KeyedJaggedTensor, key: str, value: int) -> KeyedJaggedTensor:
    values = kjt.values().clone()
    start = kjt.offset_per_key()[kjt.keys().index(key)]
    values[start] = value
    return KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=kjt.lengths())


def test_dlrm_accepts_the_collection_and_trains():
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=n, feature_names=[f"f{i}"])
              for i, n in enumerate([3000, 1200, 30])]
    model = DLRM(embedding_bag_collection=TTEmbeddingBagCollection(tables, max_rank=6, init_std=0.5),
                 dense_in_features=4, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])
    batch = 64
    dense = torch.randn(batch, 4)
    kjt = KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=torch.cat([torch.randint(0, n, (batch,)) for n in (3000, 1200, 30)]),
                            lengths=torch.ones(3 * batch, dtype=torch.long))
    labels = torch.randint(0, 2, (batch, 1)).float()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = nn.functional.binary_cross_entropy_with_logits(model(dense, kjt), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_to_ebc_round_trip():
    ours = TTEmbeddingBagCollection(make_tables(), max_rank=5)
    ebc = ours.to_ebc()
    assert type(ebc) is EmbeddingBagCollection and ours.to_dense_module().embedding_bag_configs() == ebc.embedding_bag_configs()
    kjt = make_kjt()
    torch.testing.assert_close(ebc(kjt).values(), ours(kjt).values())
    back = TTEmbeddingBagCollection.from_ebc(ebc, max_rank=5)
    torch.testing.assert_close(back(kjt).values(), ours(kjt).values(), atol=1e-5, rtol=1e-4)
    assert ours.dense_parameters() == sum(p.numel() for p in ebc.parameters())


def test_random_init_matches_each_table_scale():
    ebc = EmbeddingBagCollection(make_tables())
    ours = TTEmbeddingBagCollection.from_ebc(ebc, max_rank=8, init="random")
    for name, table in ours.tt_tables().items():
        expected = ebc.embedding_bags[name].weight.std()
        assert 0.5 < table.weight_table().std() / expected < 2
    torch.testing.assert_close(ours.embedding_bags["t_small"].weight, ebc.embedding_bags["t_small"].weight)


def test_a_meta_collection_is_tensorized_without_materialising_its_tables():
    meta = EmbeddingBagCollection(make_tables(), device=torch.device("meta"))
    ours = TTEmbeddingBagCollection.from_ebc(meta, max_rank=8, init="random")
    assert {p.device.type for p in ours.parameters()} == {"cpu"}
    reference_scale = EmbeddingBagCollection(make_tables())  # TorchRec's init_fn on real tables
    for name, table in ours.tt_tables().items():
        assert 0.5 < table.weight_table().std() / reference_scale.embedding_bags[name].weight.std() < 2
    small = ours.embedding_bags["t_small"].weight
    bound = (1 / 40) ** 0.5  # TorchRec's default init: uniform(-sqrt(1/rows), sqrt(1/rows))
    assert small.std() > 0 and bool((small.abs() <= bound).all())
    assert ours(make_kjt()).values().isfinite().all()
    with pytest.raises(ValueError, match="meta device.*init='random'"):
        TTEmbeddingBagCollection.from_ebc(meta, max_rank=8, init="svd")


def _dlrm(num_rows: int = 5000) -> DLRM:
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=n, feature_names=[f"f{i}"])
              for i, n in enumerate([num_rows, 20])]
    return DLRM(embedding_bag_collection=EmbeddingBagCollection(tables), dense_in_features=4,
                dense_arch_layer_sizes=[8, 16], over_arch_layer_sizes=[8, 1])


def test_tensorize_swaps_the_ebc_of_a_dlrm_and_to_dense_restores_it():
    model = _dlrm()
    dense = torch.randn(5, 4)
    kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([1, 4999, 7, 3, 19, 0]), lengths=torch.tensor([1, 2, 0, 1, 0, 1, 0, 0, 1, 0]))
    report = tensorize(model, embedding_max_rank=8, embedding_num_cores=3)
    collection = model.sparse_arch.embedding_bag_collection
    assert isinstance(collection, TTEmbeddingBagCollection)
    record = next(r for r in report.swapped if r.name == "sparse_arch.embedding_bag_collection")
    assert record.kind == "ebc" and record.compression > 2 and record.tt_parameters == collection.num_parameters()
    assert "ebc" in str(report)
    again = tensorize(model, embedding_max_rank=8, embedding_num_cores=3)  # idempotent: no table swapped twice
    assert not again.swapped and "sparse_arch.embedding_bag_collection" in again.already_tensorized
    before = model(dense, kjt)
    converted = to_dense(model)
    assert "sparse_arch.embedding_bag_collection" in converted
    assert type(model.sparse_arch.embedding_bag_collection) is EmbeddingBagCollection
    torch.testing.assert_close(model(dense, kjt), before)


def test_tensorize_svd_init_is_exact_at_full_rank_and_honours_layer_config():
    model = _dlrm(num_rows=1500).double()
    kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([1, 1499, 7, 3]), lengths=torch.tensor([1, 2, 0, 1]))
    expected = reference(model.sparse_arch.embedding_bag_collection, kjt)
    tensorize(model, target_modules=["embedding_bag_collection"], init="svd", embedding_max_rank=FULL_RANK, min_compression=0,
              layer_config={"embedding_bag_collection": {"min_rows": 10, "num_cores": 2}})
    collection = model.sparse_arch.embedding_bag_collection
    assert sorted(collection.tt_tables()) == ["t0", "t1"] and len(collection.embedding_bags["t0"].cores) == 2
    torch.testing.assert_close(collection(kjt).values(), expected, atol=1e-10, rtol=0)


def test_trained_tables_become_two_factors_at_a_fraction_of_their_width():
    model = _dlrm(num_rows=1500)
    tensorize(model, target_modules=["embedding_bag_collection"], init="svd", embedding_rank_fraction=0.25,
              layer_config={"embedding_bag_collection": {"min_rows": 10}})
    tables = model.sparse_arch.embedding_bag_collection.tt_tables()
    width = model.sparse_arch.embedding_bag_collection.embedding_bag_configs()[0].embedding_dim
    assert tables and all(t.row_modes[1:] == (1,) and t.ranks == (width // 4,) for t in tables.values())


def test_a_checkpoint_of_trained_tables_rebuilds_them_as_they_were_written():
    config = TensorizeConfig(target_modules=["embedding_bag_collection"], init="svd", embedding_max_rank=4)
    model = _dlrm(num_rows=1500)
    report = tensorize(model, config)
    state = model.state_dict()
    fresh = _dlrm(num_rows=1500)  # what load_from_checkpoint does: the callback's record (pinned), under init="random"
    assert restore_tensorized(fresh, {"comera": {"tensorize": pin_trained_tables(config, report.swapped).to_dict()}, "state_dict": state})
    fresh.load_state_dict(state)
    kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([1, 1499, 7, 3]), lengths=torch.tensor([1, 2, 0, 1]))
    dense = torch.randn(2, 4)
    torch.testing.assert_close(fresh(dense, kjt), model(dense, kjt))
    older = _dlrm(num_rows=1500)  # a record from before trained tables were two factors: its four-core TT-matrix
    restore_tensorized(older, {"comera": {"tensorize": config.to_dict()}, "state_dict": {}})
    assert len(older.sparse_arch.embedding_bag_collection.embedding_bags["t0"].cores) == 4


def test_pruning_one_table_keeps_the_function_and_reloads_strictly():
    ours = TTEmbeddingBagCollection(make_tables(), max_rank=6, dtype=torch.float64)
    kjt = make_kjt()
    table = ours.embedding_bags["t_big"]
    assert isinstance(table, TTEmbedding)
    with torch.no_grad():
        table.gates[0][:2] = 0
        table.gates[1][1] = 0
    before, size = ours(kjt).values(), ours.num_parameters()
    table.prune_()
    assert table.physical_ranks == (4, 5)
    assert ours.num_parameters() < size
    torch.testing.assert_close(ours(kjt).values(), before)
    fresh = TTEmbeddingBagCollection(make_tables(), max_rank=6, dtype=torch.float64)
    fresh.load_state_dict(ours.state_dict(), strict=True)
    torch.testing.assert_close(fresh(kjt).values(), before)
    assert fresh.embedding_bags["t_big"].physical_ranks == (4, 5)


def test_small_tables_stay_dense_and_repr_says_so():
    ours = TTEmbeddingBagCollection(make_tables(), max_rank=4, min_rows=1800)
    assert list(ours.tt_tables()) == ["t_mean"]
    assert "1 TT, 2 dense below min_rows=1800" in repr(ours)
    assert ours.dense_parameters() == 1500 * 12 + 2000 * 8 + 40 * 4
    assert ours.num_parameters() == sum(p.numel() for p in ours.parameters())


@pytest.mark.parametrize(
    "tables,kwargs,error,match",
    [
        ([], {}, ValueError, "at least one EmbeddingBagConfig"),
        (make_tables()[:1] * 2, {}, ValueError, "duplicate table name 't_big'"),
        ([EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, pooling=PoolingType.NONE)], {}, ValueError, "only PoolingType.SUM and MEAN"),
        (make_tables(), {"min_rows": -1}, ValueError, "min_rows must be an integer >= 0"),
        (make_tables(), {"padding_idx": 0}, ValueError, "no padding_idx"),
    ],
)
def test_bad_arguments_raise_clearly(tables, kwargs, error, match):
    with pytest.raises(error, match=match):
        TTEmbeddingBagCollection(tables, max_rank=4, **kwargs)


def test_importing_the_package_works_without_torchrec():
    code = (
        "import sys; sys.modules['torchrec'] = None\n"
        "import comera_lightning\n"
        "try:\n    from comera_lightning import TTEmbeddingBagCollection\n"
        "except ImportError as err:\n    assert 'needs torchrec' in str(err)\n"
        "else:\n    raise SystemExit('no ImportError')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_tables_inside_a_collection_are_not_reported_on_their_own():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from comera_lightning import tensorize

    holder = torch.nn.Module()
    holder.ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="t0", embedding_dim=16, num_embeddings=5000, feature_names=["f0"])])
    report = tensorize(holder, max_rank=8)
    assert [r.name for r in report.swapped] == ["ebc"] and report.skipped == []


@pytest.mark.parametrize("mean", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("lengths", [[1, 1, 1, 1, 1], [2, 0, 3, 1, 1]])
def test_training_pooling_matches_embedding_bag_in_values_and_gradients(mean, weighted, lengths):
    from comera_lightning.layers.bag_pooling import pool_bags

    lengths = torch.tensor(lengths)
    index = torch.tensor([3, 0, 3, 5, 1, 2, 2])[: int(lengths.sum())]
    weights = torch.rand(index.numel(), dtype=torch.float64) if weighted else None
    rows = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(lengths.numel(), 4, dtype=torch.float64)
    out = pool_bags(rows, index, lengths, weights, mean=mean)
    (grad,) = torch.autograd.grad(out, rows, upstream)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    expected = torch.nn.functional.embedding_bag(index, rows, offsets, mode="sum", per_sample_weights=weights, include_last_offset=True)
    if mean:
        expected = expected / lengths.clamp(min=1).unsqueeze(1)
    (expected_grad,) = torch.autograd.grad(expected, rows, upstream)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=0)
    with torch.no_grad():  # serving takes embedding_bag itself
        torch.testing.assert_close(pool_bags(rows, index, lengths, weights, mean=mean), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("weighted", [False, True])
def test_one_id_per_bag_is_gathered_in_one_pass_with_the_same_values_and_gradients(weighted):
    tables = [
        EmbeddingBagConfig(name="t_big", embedding_dim=8, num_embeddings=1500, feature_names=["a", "b"]),
        EmbeddingBagConfig(name="t_mean", embedding_dim=8, num_embeddings=2000, feature_names=["c"], pooling=PoolingType.MEAN),
        EmbeddingBagConfig(name="t_small", embedding_dim=8, num_embeddings=40, feature_names=["d", "c"]),
    ]
    ebc = EmbeddingBagCollection(tables, is_weighted=weighted).double()
    one_pass = TTEmbeddingBagCollection.from_ebc(ebc, max_rank=FULL_RANK)
    per_table = TTEmbeddingBagCollection.from_ebc(ebc, max_rank=FULL_RANK)
    per_table._gather_single_ids = lambda *args: None  # the general path, bag by bag
    batch, high = 6, {"d": 40, "c": 40, "b": 1500, "a": 1500}
    values = torch.cat([torch.randint(0, top, (batch,)) for top in high.values()])
    values[1] = values[0]  # a repeated id
    kjt = KeyedJaggedTensor(keys=list(high), values=values, lengths=torch.ones(len(high) * batch, dtype=torch.long),
                            weights=torch.rand(values.numel(), dtype=torch.float64) if weighted else None)
    got, expected = one_pass(kjt), per_table(kjt)
    torch.testing.assert_close(got.values(), expected.values(), atol=1e-12, rtol=0)
    if not weighted:  # (torch's embedding_bag has no weighted mean: that one is checked against the sum above)
        torch.testing.assert_close(got.values(), reference(ebc, kjt), atol=1e-10, rtol=0)
    upstream = torch.randn_like(got.values())
    got.values().backward(upstream)
    expected.values().backward(upstream)
    for (name, a), (_, b) in zip(one_pass.named_parameters(), per_table.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-10, rtol=0, msg=name)
