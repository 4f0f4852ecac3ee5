"""slice_optimizer_state_: slicing a parameter and its optimizer state together (rank pruning).

The equivalence checked throughout: an optimizer that trained the full parameter and then had
both sliced continues exactly like an optimizer that trained only the kept part all along.
For elementwise optimizers that holds for any gradient. For CAME it holds when the removed
slices got zero gradient (what dead rank gates give) and the update clipping is inactive (its
RMS runs over the whole tensor, zeros included).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from comera_lightning.optim import CAME, slice_optimizer_state_
from comera_lightning.optim.came import factor_layout

KEEP = torch.tensor([0, 2, 3])


def _zero_removed(grad, dim, keep):
    mask = torch.zeros(grad.shape[dim], dtype=torch.bool)
    mask[keep] = True
    shape = [1] * grad.dim()
    shape[dim] = -1
    return grad * mask.view(shape)


def _check_equivalence(make_opt, shape, dim, keep=KEEP, dead=False, steps=(6, 4), rtol=0.0, atol=0.0):
    """Train full then slice, vs train the kept part from the start; compare parameters and state."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(shape, generator=gen, dtype=torch.float64)
    full = nn.Parameter(start.clone())
    part = nn.Parameter(start.index_select(dim, keep).clone())
    opt_full, opt_part = make_opt([full]), make_opt([part])

    def train(n):
        for _ in range(n):
            g = torch.randn(shape, generator=gen, dtype=torch.float64)
            if dead and full.shape != part.shape:
                g = _zero_removed(g, dim, keep)
            full.grad = g if full.shape == shape else g.index_select(dim, keep)
            part.grad = g.index_select(dim, keep)
            opt_full.step()
            opt_part.step()

    train(steps[0])
    full.grad = torch.ones_like(full)
    with torch.no_grad():
        full.data = full.data.index_select(dim, keep)
    slice_optimizer_state_(opt_full, full, dim, keep)
    assert full.grad.shape == full.shape
    train(steps[1])
    torch.testing.assert_close(full.detach(), part.detach(), rtol=rtol, atol=atol)
    state_full, state_part = opt_full.state[full], opt_part.state[part]
    assert state_full.keys() == state_part.keys()
    for key, value in state_part.items():
        torch.testing.assert_close(state_full[key], value, rtol=rtol or 1e-10, atol=atol, msg=key)
    return opt_full, full


ELEMENTWISE = {
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.01),
}


@pytest.mark.parametrize("shape, dim", [((5, 4), 0), ((5, 4), 1), ((4, 6, 5), 0), ((4, 6, 5), 2), ((7,), 0)])
@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_optimizers_continue_exactly(name, shape, dim):
    _check_equivalence(ELEMENTWISE[name], shape, dim)


def test_step_is_untouched():
    opt, p = _check_equivalence(ELEMENTWISE["adamw_amsgrad"], (5, 4), 1)
    assert opt.state[p]["step"].item() == 10


CAME_CASES = {
    # name: (CAME kwargs, shape, dim)
    "matrix_rows": ({}, (5, 6), 0),
    "matrix_cols": ({}, (6, 5), 1),
    "core_left_rank_batch": ({}, (5, 3, 4), 0),
    "core_mode_rows": ({}, (3, 5, 4), 1),
    "core_right_rank_cols": ({}, (3, 4, 5), 2),
    "core4d_right_rank_cols": ({}, (2, 3, 2, 5), 3),
    "unfolding_left_rank_rows": ({"factor_core_unfolding": True}, (5, 3, 4), 0),
    "unfolding_right_rank_cols": ({"factor_core_unfolding": True}, (3, 4, 5), 2),
    "unfolding4d_right_rank": ({"factor_core_unfolding": True}, (2, 3, 2, 5), 3),
    "full_statistics": ({"min_factor_size": 10}, (5, 3, 4), 0),
    "gate_vector": ({}, (6,), 0),
}


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("case", CAME_CASES)
def test_came_continues_like_training_the_kept_part(case, foreach):
    kwargs, shape, dim = CAME_CASES[case]
    make = lambda p: CAME(p, lr=1e-2, weight_decay=0.05, clip_threshold=1e6, foreach=foreach, **kwargs)  # noqa: E731
    _check_equivalence(make, shape, dim, dead=True, rtol=1e-10, atol=1e-14)


def test_came_factors_are_rescaled_not_just_sliced():
    """Without rescaling the column factor the continuation drifts: this is what the test above catches."""
    make = lambda p: CAME(p, lr=1e-2, clip_threshold=1e6)  # noqa: E731
    opt, p = _check_equivalence(make, (5, 6), 0, dead=True, rtol=1e-10, atol=1e-14)
    state = opt.state[p]
    layout = factor_layout(p.shape)
    assert layout == (0, 1) and state["exp_avg_sq_row"].shape == (3,) and state["exp_avg_sq_col"].shape == (6,)


def test_came_slicing_keeps_the_second_moment_estimate():
    """For any gradients, the rank-1 estimates of the kept entries are unchanged by slicing."""
    gen = torch.Generator().manual_seed(1)
    for kwargs, shape, dim in CAME_CASES.values():
        p = nn.Parameter(torch.randn(shape, generator=gen, dtype=torch.float64))
        opt = CAME([p], lr=1e-2, **kwargs)
        for _ in range(3):
            p.grad = torch.randn(shape, generator=gen, dtype=torch.float64)
            opt.step()
        before = _estimates(opt.state[p], p.shape)
        with torch.no_grad():
            p.data = p.data.index_select(dim, KEEP)
        slice_optimizer_state_(opt, p, dim, KEEP)
        after = _estimates(opt.state[p], p.shape)
        for b, a in zip(before, after):
            torch.testing.assert_close(a, b.index_select(dim, KEEP), rtol=1e-12, atol=0)


def _estimates(state, shape):
    if "exp_avg_sq_row" not in state:
        return [v for k, v in state.items() if k in ("exp_avg", "exp_avg_sq", "exp_avg_res")]
    ndim, split = len(shape), state["exp_avg_sq_row"].dim()
    n_batch = state["exp_avg_sq_col"].dim() - (ndim - split)
    out = [state["exp_avg"]]
    for name in ("sq", "res"):
        row, col = state[f"exp_avg_{name}_row"], state[f"exp_avg_{name}_col"]
        row_mean = row.mean(dim=list(range(n_batch, split)), keepdim=True)
        row_b = (row / row_mean).reshape(list(row.shape) + [1] * (ndim - split))
        col_b = col.reshape(list(col.shape[:n_batch]) + [1] * (split - n_batch) + list(col.shape[n_batch:]))
        out.append(row_b * col_b)
    return out


def test_came_resets_when_the_factoring_decision_changes():
    p = nn.Parameter(torch.randn(8, 6))
    opt = CAME([p], lr=1e-2, min_factor_size=40)
    for _ in range(3):
        p.grad = torch.randn_like(p)
        opt.step()
    assert "exp_avg_sq_row" in opt.state[p]
    with torch.no_grad():
        p.data = p.data[:, :3]  # 24 < 40 entries: the statistics become full
    slice_optimizer_state_(opt, p, 1, torch.arange(3))
    state = opt.state[p]
    assert state["step"].item() == 3
    assert {"exp_avg_sq", "exp_avg_res"} <= set(state) and "exp_avg_sq_row" not in state
    assert all(torch.count_nonzero(v) == 0 for k, v in state.items() if k != "step")

    # a fresh state: the next update is a fresh optimizer's first update
    fresh_p = nn.Parameter(p.detach().clone())
    fresh = CAME([fresh_p], lr=1e-2, min_factor_size=40)
    p.grad = fresh_p.grad = torch.randn_like(p)
    opt.step()
    fresh.step()
    assert torch.equal(p, fresh_p)


def test_unknown_state_is_reset():
    p = nn.Parameter(torch.randn(5, 4))
    opt = torch.optim.AdamW([p], lr=1e-2)
    p.grad = torch.randn_like(p)
    opt.step()
    opt.state[p]["mystery"] = torch.zeros(3)
    with torch.no_grad():
        p.data = p.data[KEEP]
    slice_optimizer_state_(opt, p, 0, KEEP)
    assert len(opt.state[p]) == 0


def test_adafactor_keeps_its_variance_estimate():
    gen = torch.Generator().manual_seed(2)
    for shape, dim in (((5, 6), 0), ((6, 5), 1), ((5, 3, 4), 0), ((3, 5, 4), 1), ((3, 4, 5), 2), ((7,), 0)):
        p = nn.Parameter(torch.randn(shape, generator=gen, dtype=torch.float64))
        opt = torch.optim.Adafactor([p], lr=1e-2)
        for _ in range(3):
            p.grad = torch.randn(shape, generator=gen, dtype=torch.float64)
            opt.step()
        before = _adafactor_estimate(opt.state[p])
        with torch.no_grad():
            p.data = p.data.index_select(dim, KEEP)
        slice_optimizer_state_(opt, p, dim, KEEP)
        assert opt.state[p]["step"].item() == 3
        torch.testing.assert_close(_adafactor_estimate(opt.state[p]), before.index_select(dim, KEEP), rtol=1e-12, atol=0)
        p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        opt.step()
        assert torch.isfinite(p).all()


def _adafactor_estimate(state):
    if "variance" in state:
        return state["variance"]
    row, col = state["row_var"], state["col_var"]
    return row @ col / row.mean(dim=-2, keepdim=True)


def test_invalid_calls_raise():
    p, other = nn.Parameter(torch.randn(5, 4)), nn.Parameter(torch.randn(5, 4))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"not in this SGD"):
        slice_optimizer_state_(opt, other, 0, KEEP)
    with pytest.raises(ValueError, match=r"index must be 1-D with one entry per kept position"):
        slice_optimizer_state_(opt, p, 0, KEEP)  # p.data was not sliced first
    with pytest.raises(ValueError, match=r"dim must be in \[-2, 2\)"):
        slice_optimizer_state_(opt, p, 2, KEEP)


def test_parameter_without_state_only_slices_its_grad():
    p = nn.Parameter(torch.randn(5, 4))
    opt = CAME([p], lr=1e-2)
    p.grad = torch.arange(20.0).view(5, 4)
    with torch.no_grad():
        p.data = p.data[:, KEEP]
    slice_optimizer_state_(opt, p, -1, KEEP)
    assert torch.equal(p.grad, torch.arange(20.0).view(5, 4)[:, KEEP])
    assert len(opt.state[p]) == 0
