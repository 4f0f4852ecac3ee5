"""A bond in its SVD basis (TTModule.align_bond_): the tensor kept, the budget's cut="svd" on it, optimizer state carried along."""

import pytest
import torch

from comera_lightning import TTEmbedding, TTLinear
from comera_lightning.optim.gates import GateOptimizer
from comera_lightning.optim.state import rotate_optimizer_state_
from comera_lightning.rank import prune_, shrink_to_, state_follower


def weight_of(layer: TTLinear) -> torch.Tensor:
    return layer(torch.eye(layer.in_features)) - layer.bias


def uneven_gates(layer) -> None:
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 2.0)


@pytest.mark.parametrize("cores_per_side", [1, 2])
def test_aligning_a_bond_keeps_the_tensor_and_orders_the_bond_strongest_first(cores_per_side):
    layer = TTLinear(24, 30, max_rank=6, num_cores=cores_per_side).eval()
    uneven_gates(layer)
    before = weight_of(layer)
    for bond in range(len(layer.gates)):
        _, _, s = layer.align_bond_(bond)
        assert torch.all(s[:-1] >= s[1:]) and torch.all(layer.gates[bond] == 1)
    torch.testing.assert_close(weight_of(layer), before, atol=1e-5, rtol=1e-4)


def test_the_cut_is_the_best_truncation_of_the_matrix_where_the_bond_splits_inputs_from_outputs():
    layer = TTLinear(24, 30, max_rank=8, num_cores=1).eval()  # two cores: the bond is the matrix's rank
    uneven_gates(layer)
    before = weight_of(layer)
    per_index = 24 + 30
    assert shrink_to_([layer], target=5 * per_index, on_align=lambda *moved: None) == 3
    prune_(layer)
    singular = torch.linalg.svdvals(before)
    error = torch.linalg.matrix_norm(weight_of(layer) - before)
    assert layer.ranks == (5,)
    torch.testing.assert_close(error, singular[5:].norm(), atol=1e-4, rtol=1e-4)


def test_without_a_listener_and_on_vocabulary_layers_the_least_important_gates_go():
    layer = TTLinear(24, 30, max_rank=4, num_cores=1)
    table = TTEmbedding(60, 12, max_rank=4, num_cores=2)
    importance = {layer.gates[0]: torch.tensor([3.0, 1.0, 4.0, 2.0]), table.gates[0]: torch.tensor([9.0, 0.0, 9.0, 9.0])}
    shrink_to_([layer], target=2 * (24 + 30), importance=importance.get)
    assert layer.gate_masks()[0].tolist() == [True, False, True, False]
    cores_before = [core.detach().clone() for core in table.cores]
    per_index = sum(core.numel() for core in table.cores) // 4  # one rank index's entries in both cores (rank 4)
    shrink_to_([table], target=3 * per_index, importance=importance.get, on_align=lambda *moved: pytest.fail("a token table was aligned"))
    assert table.gate_masks()[0].tolist() == [True, False, True, True]
    assert all(torch.equal(a, b) for a, b in zip(cores_before, table.cores))


def test_a_token_table_keeps_its_rows_through_the_alignment():
    table = TTEmbedding(60, 12, max_rank=5, num_cores=2).eval()
    uneven_gates(table)
    rows = torch.arange(60)
    before = table(rows)
    table.align_bond_(0)
    torch.testing.assert_close(table(rows), before, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("cores_per_side", [1, 2])
def test_first_moments_become_the_gradient_in_the_new_basis(cores_per_side):
    layer = TTLinear(12, 10, max_rank=4, num_cores=cores_per_side)
    uneven_gates(layer)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.0, betas=(0.0, 0.999))  # exp_avg: this step's gradient
    inputs = torch.randn(7, 12)

    def gradients() -> list[torch.Tensor]:
        layer.zero_grad()
        layer(inputs).square().sum().backward()
        return [core.grad.clone() for core in layer.cores]

    gradients()
    optimizer.step()  # lr 0: the weights stay where the gradient was taken
    squares = [optimizer.state[core]["exp_avg_sq"].clone() for core in layer.cores]
    bond = cores_per_side - 1
    state_follower([optimizer])(layer, bond, *layer.align_bond_(bond))  # what cut="svd" runs at each cut
    after = gradients()
    for k in (bond, bond + 1):
        torch.testing.assert_close(optimizer.state[layer.cores[k]]["exp_avg"], after[k], atol=1e-5, rtol=1e-4)
        assert not torch.allclose(optimizer.state[layer.cores[k]]["exp_avg_sq"], squares[k])
    untouched = [k for k in range(len(layer.cores)) if k not in (bond, bond + 1)]
    assert all(torch.equal(optimizer.state[layer.cores[k]]["exp_avg_sq"], squares[k]) for k in untouched)


def test_a_bond_with_fewer_directions_than_live_indices_keeps_its_live_count():
    layer = TTLinear(16, 16, max_rank=4, num_cores=2).eval()  # four cores; bond 0 limited by the first mode
    with torch.no_grad():
        layer.cores[1][:, :, 1:].zero_()  # the bond after core 1 holds one direction only
    before = weight_of(layer)
    live = layer.ranks[1]
    _, _, s = layer.align_bond_(1)
    assert layer.ranks[1] == live and int((s > 0).sum()) == 1
    torch.testing.assert_close(weight_of(layer), before, atol=1e-5, rtol=1e-4)
    assert shrink_to_([layer], target=0.0, on_align=lambda *moved: None) > 0
    assert all(rank >= 1 for rank in layer.ranks)


def test_a_state_we_cannot_map_restarts():
    layer = TTLinear(12, 10, max_rank=4, num_cores=1)
    optimizer = torch.optim.Adafactor(layer.parameters())
    layer(torch.randn(3, 12)).sum().backward()
    optimizer.step()
    m, _, _ = layer.align_bond_(0)
    rotate_optimizer_state_(optimizer, layer.cores[0], -1, m)
    assert not optimizer.state[layer.cores[0]]


def test_the_gates_restart_and_share_their_importance_by_strength():
    layer = TTLinear(12, 10, max_rank=4, num_cores=1)
    gates = GateOptimizer()
    model_opt = torch.optim.AdamW(layer.parameters())
    gates.attach(list(layer.gates), [model_opt])
    layer(torch.randn(3, 12)).sum().backward()
    model_opt.step()
    state = gates.optimizer.state[layer.gates[0]]
    total = float(state["importance"].sum())
    gates.rebase_(layer.gates[0], torch.tensor([4.0, 3.0, 2.0, 1.0]))
    torch.testing.assert_close(state["importance"], torch.tensor([0.4, 0.3, 0.2, 0.1]) * total)
    assert float(state["exp_avg"].abs().sum()) == 0 and float(state["step"]) == 0
