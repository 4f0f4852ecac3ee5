"""gated_two_factor: the maths of ``x (A diag g) B + b``, its gradients, what it saves, and TTLinear training through it."""

import pytest
import torch

from comera_lightning import TTLinear
from comera_lightning.layers.two_factor import gated_two_factor


def _inputs(dtype=torch.float64, bias=True):
    torch.manual_seed(0)
    x, a, gate, b = torch.randn(7, 5), torch.randn(5, 3), torch.rand(3) + 0.5, torch.randn(3, 4)
    tensors = [x, a, gate, b] + ([torch.randn(4)] if bias else [])
    return [t.to(dtype).requires_grad_() for t in tensors] + ([] if bias else [None])


@pytest.mark.parametrize("bias", [True, False])
def test_gradients_are_the_expressions(bias):
    assert torch.autograd.gradcheck(gated_two_factor, _inputs(bias=bias))


def test_it_saves_the_input_and_parameters_but_no_rank_intermediate():
    x, a, gate, b, bias = _inputs(torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = gated_two_factor(x, a, gate, b, bias)
    assert {t.data_ptr() for t in saved} == {x.data_ptr(), a.data_ptr(), gate.data_ptr(), b.data_ptr()}
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        reference = x @ (a * gate) @ b + bias  # autograd keeps the (tokens, rank) intermediate
    assert any(t.shape == (7, 3) for t in saved)
    torch.testing.assert_close(y, reference)


def test_under_cpu_autocast_it_runs_in_bf16_and_returns_each_inputs_dtype():
    x, a, gate, b, bias = _inputs(torch.float32)
    saved = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            y = gated_two_factor(x, a, gate, b, bias)
        reference = torch.addmm(bias, x @ (a * gate), b)
    kept = sorted((tuple(t.shape), t.dtype) for t in saved if t.dtype == torch.bfloat16)
    assert kept == sorted([((7, 5), torch.bfloat16), ((5, 3), torch.bfloat16), ((3, 4), torch.bfloat16)])  # x, A·g, B cast once
    assert y.dtype == torch.bfloat16 and torch.equal(y, reference)
    grads = torch.autograd.grad(y.float().sum(), [x, a, gate, b, bias])
    want = torch.autograd.grad(reference.float().sum(), [x, a, gate, b, bias])
    for got, expected, tensor in zip(grads, want, [x, a, gate, b, bias]):
        assert got.dtype == tensor.dtype
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def _graph_has(node, name: str, depth: int = 4) -> bool:
    if node is None or depth == 0:
        return False
    return type(node).__name__ == name or any(_graph_has(n, name, depth - 1) for n, _ in node.next_functions)


@pytest.mark.parametrize("num_cores", [1, 2])
def test_a_tt_linear_trains_through_it_as_its_weight_says(num_cores):
    torch.manual_seed(1)
    layer = TTLinear(12, 10, max_rank=4, num_cores=num_cores)
    with torch.no_grad():
        layer.gates[len(layer.in_modes) - 1][1] = 0.0  # a dead index on the split bond
    x = torch.randn(6, 12, requires_grad=True)
    y = layer(x)
    assert _graph_has(y.grad_fn, "_GatedTwoFactorBackward")
    params = [x, *layer.cores, *layer.gates, layer.bias]
    grads = torch.autograd.grad(y.square().sum(), params)
    reference = x @ layer.weight_matrix().T + layer.bias
    torch.testing.assert_close(y, reference)
    for got, want in zip(grads, torch.autograd.grad(reference.square().sum(), params)):
        torch.testing.assert_close(got, want)
    assert layer.gates[len(layer.in_modes) - 1].grad is None and grads[1 + len(layer.cores) + len(layer.in_modes) - 1][1] == 0
