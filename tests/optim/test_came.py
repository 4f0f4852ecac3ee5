"""CAME: agreement with came-pytorch 0.1.3, docs/METHOD.md §4 closed forms, the factoring policy."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from comera_lightning.optim import CAME
from tests.helpers.came_helpers import make_params, train

came_pytorch = pytest.importorskip("came_pytorch")

SHAPES = [(13,), (6, 9), (3, 5, 7), (2, 3, 4, 5)]


# ---- the published algorithm -----------------------------------------------------------------


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "hparams",
    [dict(lr=1e-2), dict(lr=3e-3, betas=(0.8, 0.99, 0.995), weight_decay=0.1, clip_threshold=0.5)],
    ids=["defaults", "custom"],
)
def test_matches_came_pytorch_float64(shape, foreach, hparams):
    ours, ref = make_params([shape], torch.float64), make_params([shape], torch.float64)
    opt = CAME(ours, foreach=foreach, **hparams)
    ref_opt = came_pytorch.CAME(ref, **hparams)
    train(opt, ours, 35)
    train(ref_opt, ref, 35)
    moved = (ref[0] - make_params([shape], torch.float64)[0]).abs().max()
    assert moved > 2 * hparams["lr"]  # it really trained
    torch.testing.assert_close(ours[0], ref[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(opt.state[ours[0]]["exp_avg"], ref_opt.state[ref[0]]["exp_avg"], rtol=1e-12, atol=1e-14)
    assert opt.state[ours[0]]["step"].item() == 35


def _constant_magnitude_steps(shape, lr, optimizer_cls, **kwargs):
    sign = torch.where(torch.arange(math.prod(shape)) % 3 == 0, -1.0, 1.0).view(shape).double()
    p = nn.Parameter(torch.zeros(shape, dtype=torch.float64))
    opt = optimizer_cls([p], lr=lr, **kwargs)
    moves = []
    for _ in range(2):
        before = p.detach().clone()
        p.grad = 0.37 * sign
        opt.step()
        moves.append((before - p.detach()) * sign)  # movement against the gradient, per entry
    return moves


@pytest.mark.parametrize("optimizer_cls", [CAME, came_pytorch.CAME], ids=["ours", "came_pytorch"])
def test_closed_form_matrix(optimizer_cls):
    lr = 1e-3
    step1, step2 = _constant_magnitude_steps((4, 6), lr, optimizer_cls)
    # u is clipped to ±1; m = 0.1 then 0.19; S = (1-β3)·0.81 then β3·S + (1-β3)·0.81²
    s1 = 1e-4 * 0.81
    s2 = 0.9999 * s1 + 1e-4 * 0.81**2
    torch.testing.assert_close(step1, torch.full_like(step1, lr * 0.1 / math.sqrt(s1)), rtol=1e-12, atol=0)
    torch.testing.assert_close(step2, torch.full_like(step2, lr * 0.19 / math.sqrt(s2)), rtol=1e-12, atol=0)
    assert step1[0, 0].item() / lr == pytest.approx(11.111, abs=1e-3)  # docs/METHOD.md §4
    assert step2[0, 0].item() / lr == pytest.approx(15.692, abs=1e-3)


@pytest.mark.parametrize("optimizer_cls", [CAME, came_pytorch.CAME], ids=["ours", "came_pytorch"])
def test_closed_form_vector(optimizer_cls):
    step1, step2 = _constant_magnitude_steps((10,), 0.5, optimizer_cls)
    torch.testing.assert_close(step1, torch.full_like(step1, 0.05), rtol=1e-12, atol=0)
    torch.testing.assert_close(step2, torch.full_like(step2, 0.095), rtol=1e-12, atol=0)


def test_closed_form_full_confidence_for_small_tensors():
    # below min_factor_size the statistics are full, and the closed form is the same
    step1, step2 = _constant_magnitude_steps((4, 6), 1e-3, CAME, min_factor_size=1000)
    assert step1[0, 0].item() / 1e-3 == pytest.approx(11.111, abs=1e-3)
    assert step2[0, 0].item() / 1e-3 == pytest.approx(15.692, abs=1e-3)


@pytest.mark.parametrize("foreach", [False, True])
def test_vector_keeps_moving(foreach):
    """The old momentum-aliasing bug scaled m by lr in place each step, so 1-D params froze."""
    lr, steps = 1e-2, 200
    p = nn.Parameter(torch.zeros(5, dtype=torch.float64))
    opt = CAME([p], lr=lr, foreach=foreach)
    for _ in range(steps):
        p.grad = torch.ones_like(p)
        opt.step()
    expected = -lr * sum(1 - 0.9**t for t in range(1, steps + 1))  # u clipped to 1, m_t = 1 - 0.9^t
    torch.testing.assert_close(p.detach(), torch.full_like(p, expected), rtol=1e-10, atol=0)


# ---- factoring policy ------------------------------------------------------------------------


def test_factoring_policy_state_shapes():
    dense, small_core, core, vec = make_params([(8, 6), (2, 3, 4), (5, 3, 4, 6), (7,)])
    opt = CAME(
        [{"params": [dense, small_core, vec]}, {"params": [core], "factor_core_unfolding": True}],
        lr=1e-3,
        min_factor_size=30,
    )
    train(opt, [dense, small_core, core, vec], 1)
    assert opt.state[dense]["exp_avg_sq_row"].shape == (8,) and opt.state[dense]["exp_avg_sq_col"].shape == (6,)
    assert {"exp_avg_sq", "exp_avg_res"} <= set(opt.state[small_core]) and "exp_avg_sq_row" not in opt.state[small_core]
    assert opt.state[core]["exp_avg_res_row"].shape == (5,) and opt.state[core]["exp_avg_res_col"].shape == (3, 4, 6)
    assert "exp_avg_sq" in opt.state[vec] and "exp_avg_res" not in opt.state[vec]


def test_unfolding_factors_the_unfolding():
    """factor_core_unfolding on a 3-D core equals default CAME on the (r_left, n·r_right) matrix."""
    core, flat = make_params([(4, 3, 5)], torch.float64), make_params([(4, 15)], torch.float64)
    opt = CAME(core, lr=1e-2, factor_core_unfolding=True)
    ref = CAME(flat, lr=1e-2)
    gen = torch.Generator().manual_seed(3)
    for _ in range(10):
        g = torch.randn(4, 3, 5, generator=gen, dtype=torch.float64)
        core[0].grad, flat[0].grad = g, g.reshape(4, 15)
        opt.step()
        ref.step()
    torch.testing.assert_close(core[0].detach().reshape(4, 15), flat[0].detach(), rtol=0, atol=1e-14)
