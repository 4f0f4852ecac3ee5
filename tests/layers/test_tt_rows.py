"""The two chain contractions of TT-matrix rows (per id, and by digit groups) give the same rows and gradients."""

import pytest
import torch

from comera_lightning import TTEmbedding
from comera_lightning.layers import tt_rows
from comera_lightning.layers.tt_rows import chain_rows, grouped_chain_rows


def _cores(row_modes, col_modes, rank, seed=0):
    generator = torch.Generator().manual_seed(seed)
    bonds = [1, *[rank] * (len(row_modes) - 1), 1]
    return [torch.randn(bonds[k], n, m, bonds[k + 1], generator=generator, dtype=torch.float64, requires_grad=True)
            for k, (n, m) in enumerate(zip(row_modes, col_modes))]


def _scales(cores, seed=3):
    """One scale per bond, like masked gates: positive, one index dead."""
    generator = torch.Generator().manual_seed(seed)
    scales = [torch.rand(core.shape[-1], generator=generator, dtype=torch.float64).add(0.5) for core in cores[:-1]]
    scales[0][1] = 0.0
    return [scale.requires_grad_() for scale in scales]


def _per_id(cores, scales, row_modes, ids):
    return chain_rows([core * scale for core, scale in zip(cores, scales)] + [cores[-1]], row_modes, ids)


def _rows_and_grads(contract, cores, scales, row_modes, ids, upstream):
    for tensor in [*cores, *scales]:
        tensor.grad = None
    rows = contract(cores, scales, row_modes, ids)
    rows.backward(upstream)
    return rows.detach(), [tensor.grad.clone() for tensor in [*cores, *scales]]


@pytest.mark.parametrize("row_modes, col_modes", [((9, 8, 7), (4, 2, 2)), ((5, 6, 4, 3), (2, 3, 1, 2)), ((6, 5, 7), (1, 3, 2))])
def test_grouped_rows_and_gradients_equal_the_per_id_chain(row_modes, col_modes, monkeypatch):
    grouped_cores = []
    product = tt_rows._grouped_product
    monkeypatch.setattr(tt_rows, "_grouped_product", lambda x, core, *rest: grouped_cores.append(core) or product(x, core, *rest))
    cores = _cores(row_modes, col_modes, rank=5)
    rows_total = torch.tensor(row_modes).prod().item()
    ids = torch.cat([torch.randperm(rows_total, generator=torch.Generator().manual_seed(1))[:150], torch.tensor([0, rows_total - 1])])
    upstream = torch.randn(ids.numel(), torch.tensor(col_modes).prod().item(), dtype=torch.float64)
    scales = _scales(cores)
    expected = _rows_and_grads(_per_id, cores, scales, row_modes, ids, upstream)
    grouped = _rows_and_grads(grouped_chain_rows, cores, scales, row_modes, ids, upstream)
    assert len(grouped_cores) == len(cores) - 2  # every middle core went by digit groups
    torch.testing.assert_close(grouped[0], expected[0], atol=1e-12, rtol=0)
    for got, want in zip(grouped[1], expected[1]):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("ids", [[17], [i1 * 56 + i3 for i1 in range(9) for i3 in range(7)]], ids=["one id", "one middle digit"])
def test_digits_too_sparse_or_skewed_to_group_take_per_id_products(ids, monkeypatch):
    monkeypatch.setattr(tt_rows, "_grouped_product", lambda *args: pytest.fail("grouped where padding dominates"))
    row_modes, col_modes = (9, 8, 7), (4, 2, 2)
    cores = _cores(row_modes, col_modes, rank=3)
    scales = _scales(cores)
    ids = torch.tensor(ids)
    upstream = torch.randn(ids.numel(), 16, dtype=torch.float64)
    expected = _rows_and_grads(_per_id, cores, scales, row_modes, ids, upstream)
    got = _rows_and_grads(grouped_chain_rows, cores, scales, row_modes, ids, upstream)
    for a, b in zip([got[0], *got[1]], [expected[0], *expected[1]]):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_a_training_step_of_many_ids_matches_the_dense_table():
    layer = TTEmbedding(20_000, 16, max_rank=6, num_cores=3, lookup="chain", deduplicate=True, dtype=torch.float64)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.5, 1.5)
    dense = layer.to_embedding()
    ids = torch.randint(0, 20_000, (3_000,), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(layer(ids), dense(ids), atol=1e-12, rtol=0)
    layer(ids).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in [*layer.cores, *layer.gates])



@pytest.mark.parametrize("row_modes, col_modes", [((50, 1), (1, 6)), ((9, 1, 7), (2, 3, 2))], ids=["two factors", "a middle mode of 1"])
def test_a_core_of_one_row_mode_is_one_shared_product_with_the_tables_rows_and_gradients(row_modes, col_modes, monkeypatch):
    rows_total, dim = torch.tensor(row_modes).prod().item(), torch.tensor(col_modes).prod().item()
    layer = TTEmbedding(rows_total, dim, max_rank=4, row_modes=row_modes, col_modes=col_modes, dtype=torch.float64)
    ids = torch.tensor([0, 3, 3, rows_total - 1])
    upstream = torch.randn(ids.numel(), dim, dtype=torch.float64)
    gathered = []
    slices = tt_rows._slices
    monkeypatch.setattr(tt_rows, "_slices", lambda core, digit: gathered.append(core.shape[1]) or slices(core, digit))
    rows = chain_rows(layer.gated_cores(), layer.row_modes, ids)
    assert gathered == [n for n in row_modes if n > 1], "a core of row mode 1 is not gathered per id"
    grads = torch.autograd.grad(rows, list(layer.cores), upstream)
    expected = layer.weight_table()[ids]
    torch.testing.assert_close(rows, expected, atol=1e-12, rtol=0)
    for got, want in zip(grads, torch.autograd.grad(expected, list(layer.cores), upstream)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
