"""The lookup through the whole table (``kernels/full_table.py``): equal to the torch path, taken where it pays, built once a step."""

import lightning as L
import pytest
import torch

from comera_lightning import ComeraCallback, TTEmbedding
from comera_lightning.layers.kernels import bags_reference, full_table, ops, rows_reference, two_factor_bags, two_factor_rows
from comera_lightning.layers.kernels.full_table import full_table_bags, full_table_pays, full_table_rows
from tests.helpers.lm_modules import TinyCausalLM, code_lm_data

#: (N_L, M_L, r, N_R, M_R): odd sizes, a rank of 1, LLaMA-60M's token table's slices at a few rows.
SHAPES = [(7, 3, 5, 9, 6), (6, 4, 1, 5, 2), (3, 32, 256, 4, 16)]


def _factors(shape):
    n_left, m_left, rank, n_right, m_right = shape
    return (torch.randn(n_left, m_left, rank, dtype=torch.float64, requires_grad=True),
            torch.randn(n_right, rank, m_right, dtype=torch.float64, requires_grad=True))


def _assert_same(got, want, inputs):
    torch.testing.assert_close(got, want)
    grad = torch.randn_like(want)
    for g, w in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(want, inputs, grad)):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rows_equal_the_torch_path_with_repeated_ids(shape):
    left, right = _factors(shape)
    ids = torch.tensor([0, 3, 3, shape[0] * shape[3] - 1, 3, 5])
    _assert_same(full_table_rows(left, right, ids), rows_reference(left, right, ids), (left, right))


@pytest.mark.parametrize("mean, weighted", [(False, False), (True, True), (False, True)])
def test_bags_equal_the_torch_path_with_empty_bags(mean, weighted):
    left, right = _factors(SHAPES[0])
    lengths = torch.tensor([3, 0, 1, 5, 0, 2])
    ids = torch.randint(0, 63, (int(lengths.sum()),))
    weights = torch.rand(ids.numel(), dtype=torch.float64) if weighted else None
    _assert_same(full_table_bags(left, right, ids, lengths, weights, mean=mean),
                 bags_reference(left, right, ids, lengths, weights, mean=mean), (left, right))


def test_under_autocast_the_gemm_runs_in_its_dtype_and_the_rows_come_back_in_the_factors():
    left, right = (t.float().detach() for t in _factors(SHAPES[2]))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert full_table.full_table(left, right).dtype == torch.bfloat16
        rows = full_table_rows(left, right, torch.arange(12))
    assert rows.dtype == torch.float32  # as a dense embedding's: a residual stream stays fp32
    exact = rows_reference(left, right, torch.arange(12))
    torch.testing.assert_close(rows, exact, rtol=2e-2, atol=2e-2 * float(exact.abs().max()))


def test_it_pays_for_a_table_with_few_rows_per_lookup_and_not_beyond_its_size_cap():
    assert full_table_pays(32000, 512, 8192)  # LLaMA-60M's token table, batch 32 of 256 tokens
    assert full_table_pays(30522, 768, 4096)  # the paper's Transformer: 32 pairs of 128 tokens
    assert not full_table_pays(1_000_000, 64, 32768)  # a recommender's table (benchmarks/training/gpu_lookup.py)
    assert not full_table_pays(32000, 512, 1)  # one token
    assert not full_table_pays(10_000_000, 128, 10_000_000)  # 1.28 G elements, past MAX_TABLE_ELEMENTS
    assert not full_table_pays(0, 16, 8)


@pytest.fixture
def built(monkeypatch):
    """One entry per whole table built (``full_table.full_table`` called) while the test runs."""
    calls = []
    monkeypatch.setattr(full_table, "full_table", lambda *a, _f=full_table.full_table: calls.append(1) or _f(*a))
    return calls


@pytest.fixture
def kernels_apply(monkeypatch):
    """The routing the fused kernels' devices take (CUDA), on CPU: the kernels themselves are not run here."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(ops, "_TRITON", True)


def test_where_the_kernels_apply_many_lookups_take_the_whole_table(kernels_apply):
    left, right = _factors(SHAPES[0])
    ids = torch.randint(0, 63, (20,))
    rows = two_factor_rows(left, right, ids)
    assert type(rows.grad_fn).__name__ == "EmbeddingBackward0"
    bags = two_factor_bags(left, right, ids, torch.tensor([15, 5]), mean=True)
    assert "two_factor_bags" not in type(bags.grad_fn).__name__
    assert not ops._whole_table(left, right, ids[:7])  # 63 rows for 7 ids: the kernel's


def test_a_gpu_without_triton_takes_the_whole_table_too(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (a CUDA device's route, on CPU)
    monkeypatch.setattr(ops, "_TRITON", False)
    left, right = _factors(SHAPES[0])
    assert type(two_factor_rows(left, right, torch.randint(0, 63, (20,))).grad_fn).__name__ == "EmbeddingBackward0"


def test_a_token_table_builds_the_whole_table_once_a_step_and_equals_its_dense_table(kernels_apply, built):
    """No recomputation in backward (the torch path's checkpoint): the table's GEMM runs once a forward and backward."""
    layer = TTEmbedding(300, 24, max_rank=8, num_cores=2, padding_idx=2)
    with torch.no_grad():
        layer.gates[0][::3] = 0.0  # dead ranks
    ids = torch.randint(0, 300, (4, 40))
    rows = layer(ids)
    expected = layer.weight_table()[ids]
    torch.testing.assert_close(rows, expected, rtol=1e-5, atol=1e-5)
    params = [*layer.cores, *layer.gates]
    grad = torch.randn_like(rows)
    for got, want in zip(torch.autograd.grad(rows, params, grad), torch.autograd.grad(expected, params, grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert len(built) == 1


def test_the_whole_table_compiles_into_one_graph(kernels_apply):
    """What ``torch.compile`` and CUDA graphs capture on a GPU: no graph break, the same gradients."""
    layer = TTEmbedding(300, 24, max_rank=8, num_cores=2)
    ids = torch.randint(0, 300, (4, 40))

    def loss(ids):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return layer(ids).square().sum()

    params = list(layer.parameters())
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True, backend="aot_eager")(ids), params, allow_unused=True)
    want = torch.autograd.grad(loss(ids), params, allow_unused=True)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("forced, many_ids, few_ids", [("1", True, True), ("0", False, False)])
def test_comera_whole_table_forces_the_route_on_any_device(monkeypatch, built, forced, many_ids, few_ids):
    """``1``: the step account counts a GPU's route on CPU; ``0``: the kernels' or the torch path's, as before."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("COMERA_WHOLE_TABLE", forced)
    left, right = _factors(SHAPES[0])
    assert ops._whole_table(left, right, torch.arange(20)) == many_ids
    assert ops._whole_table(left, right, torch.arange(2)) == few_ids
    layer = TTEmbedding(300, 24, max_rank=8, num_cores=3, lookup="tables")  # a longer train's half tables
    ids = torch.randint(0, 300, (2, 30))
    rows = layer(ids)
    assert bool(built) == many_ids
    torch.testing.assert_close(rows, layer.weight_table()[ids], rtol=1e-5, atol=1e-5)


class _Losses(L.Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.values.append(float(outputs["loss"]))


def test_a_hugging_face_llama_trains_through_the_whole_table_as_through_the_torch_path(tmp_path, monkeypatch, built):
    """Code nobody here wrote (``transformers``' Llama on the standard library's source), the callback's defaults, 30
    steps: the losses of the two routes agree to rounding (the token table's gradients, gates and all)."""
    data = code_lm_data(tmp_path)
    runs = {}
    for route in ("1", "0"):
        monkeypatch.setenv("COMERA_WHOLE_TABLE", route)
        assert len(built) == (0 if route == "1" else 30)  # one table a step through the whole table, none by the torch path
        L.seed_everything(0)
        losses = _Losses()
        trainer = L.Trainer(max_steps=30, callbacks=[ComeraCallback(), losses], logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0)
        trainer.fit(TinyCausalLM(data.vocab_size), datamodule=data)
        runs[route] = losses.values
    assert len(runs["1"]) == 30 and runs["1"][-1] < runs["1"][0] - 0.5
    assert max(abs(a - b) for a, b in zip(runs["1"], runs["0"])) < 1e-4, (runs["1"][-3:], runs["0"][-3:])


@pytest.mark.parametrize("weighted", [False, True])
def test_torchrec_bags_pool_through_the_whole_table_as_through_the_torch_path(monkeypatch, built, weighted):
    torchrec = pytest.importorskip("torchrec")
    from comera_lightning import TTEmbeddingBagCollection

    tables = [torchrec.EmbeddingBagConfig(name="sum", embedding_dim=12, num_embeddings=1500, feature_names=["a", "b"]),
              torchrec.EmbeddingBagConfig(name="mean", embedding_dim=8, num_embeddings=2000, feature_names=["c"],
                                          pooling=torchrec.PoolingType.MEAN)]
    collection = TTEmbeddingBagCollection(tables, max_rank=6, num_cores=2, is_weighted=weighted)
    lengths = torch.tensor([20, 0, 31, 12, 25, 0, 40, 9, 22])  # 3 features x 3 bags, empty bags among them
    values = torch.cat([torch.randint(0, top, (int(n),)) for top, n in zip((1500, 1500, 2000), lengths.view(3, 3).sum(1))])
    features = torchrec.KeyedJaggedTensor(keys=["a", "b", "c"], values=values, lengths=lengths,
                                          weights=torch.rand(values.numel()) if weighted else None)
    params, outputs, grads = list(collection.parameters()), {}, {}
    for route in ("1", "0"):
        monkeypatch.setenv("COMERA_WHOLE_TABLE", route)
        outputs[route] = collection(features).values()
        assert len(built) == 2  # both tables through the whole table, then none
        grads[route] = torch.autograd.grad(outputs[route], params, torch.ones_like(outputs[route]), allow_unused=True)
    torch.testing.assert_close(outputs["1"], outputs["0"], rtol=1e-5, atol=1e-5)
    for got, want in zip(grads["1"], grads["0"]):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
