"""GateBank: the mask rule, the size terms and the exact size over all bonds at once equal the per-bond maths."""

import math

import pytest
import torch
from torch import nn

from comera_lightning import TTEmbedding, TTLinear
from comera_lightning.layers import TTModule
from comera_lightning.layers.gate_bank import GateBank
from comera_lightning.layers.gate_masks import rule_masks
from comera_lightning.optim.gates import GateOptimizer
from comera_lightning.rank import gate_weights, prune_


def _layers(seed: int = 0, nan: bool = True) -> list[TTModule]:
    torch.manual_seed(seed)
    layers = [TTLinear(24, 16, max_rank=6, num_cores=2), TTLinear(16, 8, max_rank=5, num_cores=1),
              TTEmbedding(40, 8, max_rank=4, num_cores=3)]
    layers[1].allow_rank0 = True
    layers[2].gate_threshold = 0.3
    with torch.no_grad():
        for layer in layers:
            for gate in layer.gates:
                gate.uniform_(-0.5, 1.0)
        layers[0].gates[0][:] = 0.001  # every gate of a bond below the threshold: its strongest stays
        layers[0].gates[0][3] = -0.002  # the strongest by magnitude
        if nan:
            layers[0].gates[1][1] = float("nan")  # a NaN stays live
        layers[1].gates[0][:] = 0.0  # rank 0 allowed: the whole bond dies
        layers[2].gates[0][:2] = 0.25  # a tie below this layer's threshold
        layers[2].kill_(1, [0])  # dead for good whatever its gate
    return layers


def test_the_bulk_latch_equals_each_layers_rule_and_zeroes_the_dead_gates():
    layers = _layers()
    expected = [rule_masks(l._alive_masks(), list(l.gates), l.gate_threshold, l.allow_rank0) for l in layers]
    bank = GateBank(layers)
    bank.latch_()
    for layer, masks in zip(layers, expected):
        assert layer.masks_latched()
        for alive, mask, gate in zip(layer._alive_masks(), masks, layer.gates):
            assert torch.equal(alive, mask)
            assert torch.all(gate.detach()[~mask] == 0)
    assert layers[0].gate_masks()[0].sum() == 1 and layers[0].gate_masks()[0][3]
    assert not layers[1].gate_masks()[0].any()


def test_a_write_to_a_gate_unlatches_its_layer_and_the_next_latch_sees_it():
    layers = _layers()
    bank = GateBank(layers)
    bank.latch_()
    with torch.no_grad():
        layers[2].gates[1][2] = 0.0
    assert not layers[2].masks_latched() and layers[0].masks_latched()
    assert not layers[2].gate_masks()[1][2]  # the rule, computed while unlatched
    bank.latch_()
    assert layers[2].masks_latched() and not layers[2]._alive_masks()[1][2]


@pytest.mark.parametrize("kind", ["mean", "size"])
@pytest.mark.parametrize("latched", [False, True])
def test_the_size_terms_and_their_gradients_equal_the_per_bond_sums(kind, latched):
    layers = _layers(nan=False)
    if latched:
        GateBank(layers).latch_()
    reference_total = reference_top = 0
    for layer in layers:
        weights = gate_weights(layer) if kind == "size" else [1] * len(layer.gates)
        for gate, mask, weight in zip(layer.gates, layer.gate_masks(), weights):
            live = (gate * mask).float()
            reference_total = reference_total + live.sum() * weight
            if live.numel():
                reference_top = reference_top + live.max() * weight
    gates = [g for layer in layers for g in layer.gates]
    want = torch.autograd.grad(reference_total + 2 * reference_top, gates)
    total, top = GateBank(layers).surrogate_sums(kind, strongest=True)
    torch.testing.assert_close(total, reference_total)
    torch.testing.assert_close(top, reference_top)
    got = torch.autograd.grad(total + 2 * top, gates)
    for g, w, mask in zip(got, want, [m for layer in layers for m in layer.gate_masks()]):
        torch.testing.assert_close(g, w)
        assert torch.all(g[~mask] == 0)  # a dead gate gets no gradient


def test_the_exact_size_equals_each_layers_count_and_follows_a_prune():
    layers = _layers()
    bank = GateBank(layers)
    assert float(bank.active_size()) == sum(float(layer.active_size()) for layer in layers)
    bank.latch_()
    prune_(nn.ModuleList(layers))
    assert float(bank.active_size()) == sum(float(layer.active_size()) for layer in layers)
    assert float(bank.active_size()) == sum(sum(c.numel() for c in layer.cores) for layer in layers)


def _train(latch: bool, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Thirty steps of two TT layers, gates at a high LR (some die), the objective L + R over a bank."""
    if not latch:  # every forward computes the rule, as before masks were latched
        monkeypatch.setattr(TTModule, "masks_latched", lambda self, key=None: False)
    torch.manual_seed(3)
    model = nn.Sequential(TTLinear(12, 16, max_rank=6, num_cores=1), nn.Tanh(), TTLinear(16, 4, max_rank=4, num_cores=2))
    layers = [model[0], model[2]]
    bank = GateBank(layers)
    bank.attach()  # latched, the layers and the size term take views of one gate vector a step
    gates = [g for layer in layers for g in layer.gates]
    host = torch.optim.Adam(model.parameters(), lr=1e-2)
    gate_opt = GateOptimizer(lr=0.2)
    gate_opt.attach(gates, [host], after_step=bank.latch_)
    x, y = torch.randn(32, 12), torch.randn(32, 4)
    losses = []
    for _ in range(30):
        task = (model(x) - y).pow(2).mean()
        total, _ = bank.surrogate_sums("mean", strongest=False)
        (task + 0.05 * total / 10).backward()
        host.step()
        host.zero_grad()
        losses.append(task.item())
    assert sum(int(m.sum()) for layer in layers for m in layer.gate_masks()) < sum(g.numel() for g in gates)  # some died
    monkeypatch.undo()
    return losses


def test_a_latched_run_trains_exactly_as_the_rule_in_every_forward(monkeypatch):
    assert _train(True, monkeypatch) == _train(False, monkeypatch)


def test_the_step_vector_gives_each_gate_one_gradient_and_is_forgotten_after_backward():
    layers = _layers(nan=False)
    bank = GateBank(layers)
    bank.attach()
    bank.latch_()
    vector = bank.step_vector()
    assert vector is not None and bank.step_vector() is vector  # one vector a step
    x = torch.randn(3, 24)
    out = layers[1](layers[0](x)).sum() + layers[2](torch.tensor([1, 7])).sum()
    assert all(s.untyped_storage().data_ptr() == vector.untyped_storage().data_ptr() for s in layers[0].bond_scales())
    total, _ = bank.surrogate_sums("mean", strongest=False)
    (out + total).backward()
    assert bank._vector is None and not bank._pieces
    for layer in layers:
        for gate, alive in zip(layer.gates, layer._alive_masks()):
            assert torch.all(gate.grad[~alive] == 0)
    with torch.no_grad():
        assert bank.step_vector() is None  # no autograd: nothing to share


def test_a_bank_of_no_trains_has_nothing_to_latch():
    GateBank([]).latch_()
    assert not GateBank([]).uniform()


def test_weights_follow_the_cores_a_bond_joins():
    layer = TTLinear(8, 6, max_rank=3, num_cores=1)
    assert gate_weights(layer) == [math.prod(layer.cores[0].shape[:-1]) + math.prod(layer.cores[1].shape[1:])]
