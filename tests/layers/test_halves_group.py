"""HalvesGroup: layers of one core layout contract their halves together, as each would alone, in fewer kernels."""

import copy
import pickle

import torch
from torch import nn

from comera_lightning import TTLinear
from comera_lightning.layers.gate_bank import GateBank
from comera_lightning.layers.halves_group import group_halves
from comera_lightning.rank import latch_dead_gates_, prune_
from tests.helpers.kernel_count import kernels


def _models(count: int = 4, latch: bool = True) -> tuple[nn.Sequential, nn.Sequential]:
    torch.manual_seed(0)
    model = nn.Sequential(*[TTLinear(24, 24, max_rank=5, num_cores=3) for _ in range(count)], TTLinear(24, 8, max_rank=4, num_cores=3))
    with torch.no_grad():
        model[1].gates[1][0] = 0.0  # a dead index
    alone = copy.deepcopy(model)
    for m in (model, alone):  # as the callback does: the gates in one vector a step
        GateBank(list(m)).attach()
    if latch:
        latch_dead_gates_(model)
        latch_dead_gates_(alone)
    return model, alone


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    y = model(x)
    y.square().sum().backward()
    return y.detach(), [p.grad.clone() for p in model.parameters()]


def test_grouped_layers_compute_what_each_computes_alone_in_fewer_kernels():
    model, alone = _models()
    groups = group_halves(list(model))
    assert len(groups) == 1 and len(groups[0].layers) == 4  # the last layer's layout is its own: not grouped
    x = torch.randn(10, 24)
    (y, grads), (y_alone, grads_alone) = _step(model, x), _step(alone, x)
    torch.testing.assert_close(y, y_alone)
    for g, g_alone in zip(grads, grads_alone):
        torch.testing.assert_close(g, g_alone)
    assert model[1].gates[1].grad[0] == 0  # a dead gate gets no gradient
    assert not groups[0]._cached  # the step's halves are forgotten once their gradient is computed
    grouped, each_alone = (kernels(lambda m=m: m(x).square().sum().backward()) for m in (model, alone))
    assert grouped < 0.8 * each_alone, (grouped, each_alone)


def test_two_forwards_before_a_step_each_get_their_own_graph():
    model, alone = _models()
    group_halves(list(model))
    x1, x2 = torch.randn(6, 24), torch.randn(6, 24)
    for m in (model, alone):  # gradient accumulation: two backward passes, then the step
        m(x1).sum().backward()
        m(x2).square().sum().backward()
    for p, q in zip(model.parameters(), alone.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_a_changed_member_is_contracted_afresh_and_unlatched_layers_contract_alone():
    model, alone = _models(latch=False)
    group = group_halves(list(model))[0]
    x = torch.randn(5, 24)
    torch.testing.assert_close(model(x), alone(x))  # unlatched: each layer alone (its first forward latches it)
    with torch.no_grad():
        for m in (model, alone):
            m[2].cores[0].mul_(2.0)
    y = model(x)
    torch.testing.assert_close(y, alone(x))
    assert len(group._cached) == 4


def test_after_a_prune_the_layouts_that_differ_contract_apart():
    model, alone = _models()
    group_halves(list(model))
    prune_(model)
    prune_(alone)
    x = torch.randn(7, 24)
    torch.testing.assert_close(_step(model, x)[0], _step(alone, x)[0])


def test_copies_and_pickles_leave_the_group_behind():
    model, _ = _models()
    group_halves(list(model))
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert all("_halves_group" not in layer.__dict__ for layer in copied)
        copied(torch.randn(3, 24)).sum().backward()
