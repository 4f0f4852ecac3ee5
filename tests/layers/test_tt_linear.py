import pytest
import torch
from torch import nn

from comera_lightning import TTLinear

SHAPES = [  # (in, out, num_cores, max_rank)
    (768, 768, 3, 30),
    (24, 36, (2, 3), 5),
    (30, 20, (3, 1), 100),
    (64, 64, 4, 3),
    (7, 13, 2, 4),  # primes: padded internally
]


def _random_gates(layer):
    with torch.no_grad():
        for g in layer.gates:
            g.uniform_(0.5, 1.5)


@pytest.mark.parametrize("d_in,d_out,cores,rank", SHAPES)
def test_matches_dense_export_at_every_split(d_in, d_out, cores, rank):
    layer = TTLinear(d_in, d_out, max_rank=rank, num_cores=cores, dtype=torch.float64)
    _random_gates(layer)
    dense = layer.to_linear()
    x = torch.randn(2, 3, d_in, dtype=torch.float64, requires_grad=True)
    y_ref = dense(x)
    (gx_ref,) = torch.autograd.grad(y_ref.square().sum(), x)
    for split in range(1, len(layer.cores)):
        layer.best_split = lambda tokens, s=split: s
        y = layer(x)
        (gx,) = torch.autograd.grad(y.square().sum(), x)
        torch.testing.assert_close(y, y_ref, atol=1e-9, rtol=0)
        torch.testing.assert_close(gx, gx_ref, atol=1e-9, rtol=0)


@pytest.mark.parametrize("d_in,d_out,cores", [(24, 36, (2, 3)), (12, 10, 2), (8, 27, 3)])
def test_tt_svd_is_exact_at_full_rank(d_in, d_out, cores):
    linear = nn.Linear(d_in, d_out, dtype=torch.float64)
    layer = TTLinear.from_linear(linear, max_rank=10_000, num_cores=cores)
    torch.testing.assert_close(layer.to_linear().weight, linear.weight, atol=1e-10, rtol=0)
    x = torch.randn(5, d_in, dtype=torch.float64)
    torch.testing.assert_close(layer(x), linear(x), atol=1e-10, rtol=0)


def test_tt_svd_truncation_is_the_best_rank_one_approximation_for_two_cores():
    linear = nn.Linear(6, 4, bias=False, dtype=torch.float64)
    layer = TTLinear.from_linear(linear, max_rank=1, in_modes=(6,), out_modes=(4,))
    u, s, vh = torch.linalg.svd(linear.weight.T)
    best = s[0] * torch.outer(u[:, 0], vh[0])
    torch.testing.assert_close(layer.to_linear().weight.T, best, atol=1e-10, rtol=0)


def test_gradients_reach_every_core_and_gate():
    layer = TTLinear(48, 40, max_rank=6)
    layer(torch.randn(4, 48)).square().sum().backward()
    for p in list(layer.cores) + list(layer.gates) + [layer.bias]:
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_dead_gates_mask_output_and_gradient_and_never_revive():
    layer = TTLinear(16, 16, max_rank=4, num_cores=1)
    with torch.no_grad():
        layer.gates[0][1] = 0.001  # below the 1e-2 threshold
    layer(torch.randn(3, 16)).sum().backward()
    assert layer.gates[0].grad[1] == 0
    assert layer.cores[0].grad[..., 1].abs().sum() == 0
    assert layer.ranks == (3,)
    with torch.no_grad():
        layer.gates[0][1] = 5.0  # an optimizer pushing it back up
    assert layer.ranks == (3,), "a dead gate must stay dead"


def test_variance_matched_init():
    torch.manual_seed(1)
    layer = TTLinear(768, 768, max_rank=30, init_std=0.05)
    std = layer.to_linear().weight.std().item()
    assert 0.04 < std < 0.06


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtypes_and_leading_dims(dtype):
    layer = TTLinear(32, 48, max_rank=8, dtype=dtype)
    y = layer(torch.randn(2, 3, 4, 32, dtype=dtype))
    assert y.shape == (2, 3, 4, 48) and y.dtype == dtype
    assert torch.isfinite(y).all()


@pytest.mark.gpu
def test_runs_on_cuda():
    layer = TTLinear(64, 96, max_rank=8, device="cuda")
    x = torch.randn(10, 64, device="cuda")
    torch.testing.assert_close(layer(x), layer.to_linear()(x), atol=1e-4, rtol=1e-4)


def test_physical_prune_keeps_function_and_shrinks_cores():
    layer = TTLinear(32, 32, max_rank=8, num_cores=1, dtype=torch.float64)
    with torch.no_grad():
        layer.gates[0][[0, 3, 5]] = 0.0
    x = torch.randn(5, 32, dtype=torch.float64)
    before, params_before = layer(x), layer.num_parameters()
    records = layer.prune_()
    assert layer.physical_ranks == (5,)
    assert layer.num_parameters() < params_before
    assert {r.dim for r in records} == {0, 2}
    torch.testing.assert_close(layer(x), before)


def test_rank_zero_leaves_only_the_bias():
    layer = TTLinear(16, 8, max_rank=4, num_cores=1)
    layer.allow_rank0 = True
    with torch.no_grad():
        layer.gates[0].zero_()
    layer.prune_()
    assert layer.physical_ranks == (0,)
    torch.testing.assert_close(layer(torch.randn(3, 16)), layer.bias.expand(3, 8))


def test_a_bond_keeps_its_strongest_gate_unless_rank_zero_is_allowed():
    layer = TTLinear(16, 8, max_rank=4, num_cores=1)
    with torch.no_grad():
        layer.gates[0].copy_(torch.tensor([0.0, 0.004, -0.006, 0.002]))
    assert layer.ranks == (1,) and layer.gate_masks()[0].tolist() == [False, False, True, False]
    layer.prune_()
    assert layer.physical_ranks == (1,)
    assert not torch.equal(layer(torch.randn(3, 16)), layer.bias.expand(3, 8))


def test_pruned_state_dict_loads_strictly_into_a_fresh_layer():
    layer = TTLinear(32, 32, max_rank=8)
    with torch.no_grad():
        layer.gates[1][:5] = 0.0
    layer.prune_()
    fresh = TTLinear(32, 32, max_rank=8)
    fresh.load_state_dict(layer.state_dict(), strict=True)
    assert fresh.physical_ranks == layer.physical_ranks
    x = torch.randn(4, 32)
    torch.testing.assert_close(fresh(x), layer(x))


def test_extra_repr_names_modes_ranks_and_compression():
    text = repr(TTLinear(768, 3072, max_rank=30))
    assert "12·8·8 → 12·16·16" in text and "ranks=[12, 30, 30, 30, 16]" in text and "compression=73.5x" in text


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(in_features=0, out_features=4, max_rank=2), "in_features must be a positive integer, got 0"),
        (dict(in_features=4, out_features=-1, max_rank=2), "out_features must be a positive integer, got -1"),
        (dict(in_features=4, out_features=4, max_rank=0), "max_rank must be >= 1, got 0"),
        (dict(in_features=8, out_features=8, max_rank=2, in_modes=(2, 2)), r"in_modes=\(2, 2\)"),
        (dict(in_features=8, out_features=8, max_rank=2, num_cores=0), "num_cores"),
        (dict(in_features=8, out_features=8, max_rank=2, gate_threshold=2), "gate_threshold"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TTLinear(**kwargs)


def test_wrong_input_width_is_reported():
    with pytest.raises(ValueError, match="last dim 8"):
        TTLinear(8, 8, max_rank=2)(torch.randn(3, 9))
