"""CAME: agreement with came-pytorch 0.1.3, docs/METHOD.md §4 closed forms, state handling, graph safety."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from comera_lightning.optim import CAME

came_pytorch = pytest.importorskip("came_pytorch")

SHAPES = [(13,), (6, 9), (3, 5, 7), (2, 3, 4, 5)]


def _params(shapes, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64).to(dtype)) for s in shapes]


def _set_grads(params, gen, zero_rows=None):
    for p in params:
        g = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        if zero_rows is not None and p.dim() >= 2:
            g[..., zero_rows, :] = 0
        p.grad = g.to(p.dtype)


def _train(opt, params, steps, seed=1, zero_rows=None):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        _set_grads(params, gen, zero_rows)
        opt.step()


def _state_tensors(opt):
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


# ---- the published algorithm -----------------------------------------------------------------


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "hparams",
    [dict(lr=1e-2), dict(lr=3e-3, betas=(0.8, 0.99, 0.995), weight_decay=0.1, clip_threshold=0.5)],
    ids=["defaults", "custom"],
)
def test_matches_came_pytorch_float64(shape, foreach, hparams):
    ours, ref = _params([shape], torch.float64), _params([shape], torch.float64)
    opt = CAME(ours, foreach=foreach, **hparams)
    ref_opt = came_pytorch.CAME(ref, **hparams)
    _train(opt, ours, 35)
    _train(ref_opt, ref, 35)
    moved = (ref[0] - _params([shape], torch.float64)[0]).abs().max()
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
    dense, small_core, core, vec = _params([(8, 6), (2, 3, 4), (5, 3, 4, 6), (7,)])
    opt = CAME(
        [{"params": [dense, small_core, vec]}, {"params": [core], "factor_core_unfolding": True}],
        lr=1e-3,
        min_factor_size=30,
    )
    _train(opt, [dense, small_core, core, vec], 1)
    assert opt.state[dense]["exp_avg_sq_row"].shape == (8,) and opt.state[dense]["exp_avg_sq_col"].shape == (6,)
    assert {"exp_avg_sq", "exp_avg_res"} <= set(opt.state[small_core]) and "exp_avg_sq_row" not in opt.state[small_core]
    assert opt.state[core]["exp_avg_res_row"].shape == (5,) and opt.state[core]["exp_avg_res_col"].shape == (3, 4, 6)
    assert "exp_avg_sq" in opt.state[vec] and "exp_avg_res" not in opt.state[vec]


def test_unfolding_factors_the_unfolding():
    """factor_core_unfolding on a 3-D core equals default CAME on the (r_left, n·r_right) matrix."""
    core, flat = _params([(4, 3, 5)], torch.float64), _params([(4, 15)], torch.float64)
    opt = CAME(core, lr=1e-2, factor_core_unfolding=True)
    ref = CAME(flat, lr=1e-2)
    gen = torch.Generator().manual_seed(3)
    for _ in range(10):
        g = torch.randn(4, 3, 5, generator=gen, dtype=torch.float64)
        core[0].grad, flat[0].grad = g, g.reshape(4, 15)
        opt.step()
        ref.step()
    torch.testing.assert_close(core[0].detach().reshape(4, 15), flat[0].detach(), rtol=0, atol=1e-14)


# ---- implementation properties ---------------------------------------------------------------


def _mixed_params(dtype):
    shapes = [(6, 5), (6, 5), (6, 5), (4, 3, 5), (4, 3, 5), (2, 3, 4, 2), (9,), (9,), (3,), (2, 2), (3, 2, 2)]
    return _params(shapes, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foreach_matches_loop(dtype):
    def make(foreach):
        params = _mixed_params(dtype)
        groups = [
            {"params": params[:8]},
            {"params": params[8:], "factor_core_unfolding": True, "min_factor_size": 5, "weight_decay": 0.0},
        ]
        return params, CAME(groups, lr=1e-2, weight_decay=0.05, foreach=foreach)

    (pa, oa), (pb, ob) = make(False), make(True)
    _train(oa, pa, 20, zero_rows=1)
    _train(ob, pb, 20, zero_rows=1)
    for a, b in zip(pa, pb):
        assert torch.equal(a, b)
        for key, value in oa.state[a].items():
            assert torch.equal(value, ob.state[b][key]), key


def test_foreach_chunks_large_buckets(monkeypatch):
    import comera_lightning.optim.came_foreach as foreach_module

    (pa, pb) = _mixed_params(torch.float32), _mixed_params(torch.float32)
    oa, ob = CAME(pa, lr=1e-2, foreach=True), CAME(pb, lr=1e-2, foreach=False)
    monkeypatch.setattr(foreach_module, "_STACK_NUMEL", 70)  # two (6, 5) tensors per chunk
    monkeypatch.setattr(foreach_module, "_STACK_BELOW", 50)  # (4, 3, 5) and (2, 3, 4, 2) one at a time
    _train(oa, pa, 5)
    _train(ob, pb, 5)
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_roundtrip_bit_identical(foreach, dtype):
    def make():
        params = _mixed_params(dtype)
        groups = [{"params": params[:6]}, {"params": params[6:], "min_factor_size": 10, "lr": 3e-3}]
        return params, CAME(groups, lr=1e-2, weight_decay=0.01, foreach=foreach)

    straight, opt = make()
    _train(opt, straight, 12, seed=5)

    first, opt1 = make()
    gen = torch.Generator().manual_seed(5)
    for _ in range(6):
        _set_grads(first, gen)
        opt1.step()
    buffer = io.BytesIO()
    torch.save({"params": [p.detach() for p in first], "optim": opt1.state_dict()}, buffer)
    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=True)

    resumed, opt2 = make()
    with torch.no_grad():
        for p, saved in zip(resumed, ckpt["params"]):
            p.copy_(saved)
    opt2.load_state_dict(ckpt["optim"])
    assert all(v.dtype in (torch.float32, torch.float64) for v in _state_tensors(opt2))  # fp32 state kept
    for _ in range(6):
        _set_grads(resumed, gen)
        opt2.step()
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)
    for a, b in zip(straight, resumed):
        for key, value in opt.state[a].items():
            assert torch.equal(value, opt2.state[b][key]), key


def test_no_shared_storage():
    params = _mixed_params(torch.bfloat16)
    opt = CAME(params, lr=1e-2, foreach=True)
    _train(opt, params, 2)
    loaded = CAME(_mixed_params(torch.bfloat16), lr=1e-2)
    loaded.load_state_dict(opt.state_dict())
    for optimizer in (opt, loaded):
        ptrs = [t.untyped_storage().data_ptr() for t in _state_tensors(optimizer)]
        assert len(ptrs) == len(set(ptrs))
    # loading copies: the two optimizers never alias each other either
    assert not {t.untyped_storage().data_ptr() for t in _state_tensors(opt)} & {
        t.untyped_storage().data_ptr() for t in _state_tensors(loaded)
    }


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_params_stay_finite_with_zero_gradient_rows(foreach, dtype):
    params = _params([(16, 32), (4, 8, 6), (32,)], dtype)
    start = [p.detach().clone() for p in params]
    opt = CAME(params, lr=1e-3, foreach=foreach)
    _train(opt, params, 150, zero_rows=slice(0, 4))
    for p, p0 in zip(params, start):
        assert p.dtype == dtype and torch.isfinite(p).all()
        assert all(v.dtype == torch.float32 for v in opt.state[p].values())
        if p.dim() >= 2:
            assert torch.equal(p[..., :4, :], p0[..., :4, :])  # no gradient, no decay: untouched
            assert not torch.equal(p[..., 4:, :], p0[..., 4:, :])


@pytest.mark.parametrize("foreach", [False, True])
def test_step_never_reads_tensors_on_host(foreach, monkeypatch):
    params = _mixed_params(torch.bfloat16)
    opt = CAME(params, lr=torch.tensor(1e-2), weight_decay=0.1, foreach=foreach, capturable=True)
    gen = torch.Generator().manual_seed(0)

    def forbidden(*args, **kwargs):
        raise AssertionError("host synchronisation inside CAME.step")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    for _ in range(3):  # includes the lazy state initialisation
        _set_grads(params, gen)
        opt.step()
    monkeypatch.undo()
    assert all(torch.isfinite(p).all() for p in params)


@pytest.mark.parametrize("foreach", [False, True])
def test_non_contiguous_gradients(foreach):
    pa, pb = _params([(6, 5), (3, 6, 5)]), _params([(6, 5), (3, 6, 5)])
    oa, ob = CAME(pa, lr=1e-2, foreach=foreach), CAME(pb, lr=1e-2, foreach=foreach)
    for _ in range(3):
        for a, b in zip(pa, pb):
            g = torch.randn(a.shape[::-1]).permute(*reversed(range(a.dim())))
            a.grad, b.grad = g, g.contiguous()
        oa.step()
        ob.step()
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))


def test_tensor_lr_matches_float_lr():
    pa, pb = _mixed_params(torch.float32), _mixed_params(torch.float32)
    oa = CAME(pa, lr=1e-2, weight_decay=0.1)
    ob = CAME(pb, lr=torch.tensor(1e-2), weight_decay=0.1, capturable=True)
    _train(oa, pa, 5)
    _train(ob, pb, 5)
    for a, b in zip(pa, pb):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_grad_none_is_skipped_and_sparse_grad_raises():
    used, unused = _params([(3, 4), (5,)])
    before = unused.detach().clone()
    opt = CAME([used, unused], lr=1e-2)
    used.grad = torch.ones_like(used)
    opt.step()
    assert torch.equal(unused, before) and len(opt.state[unused]) == 0

    emb = nn.Embedding(10, 4, sparse=True)
    opt = CAME(emb.parameters(), lr=1e-2)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        opt.step()


def test_closure_returns_loss():
    p = nn.Parameter(torch.ones(3, 3))
    opt = CAME([p], lr=1e-2)

    def closure():
        opt.zero_grad()
        loss = (p**2).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 9.0


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(lr=0.0), r"lr must be a positive number.*got 0\.0"),
        (dict(lr=-1e-3), r"lr must be a positive number.*got -0\.001"),
        (dict(lr=None), r"lr must be a positive number.*got None"),
        (dict(lr="1e-3"), r"lr must be a positive number.*got '1e-3'"),
        (dict(lr=float("nan")), r"lr must be a positive number.*got nan"),
        (dict(lr=torch.tensor(-1.0)), r"lr must be a positive number"),
        (dict(lr=1e-3, betas=(0.9, 1.0, 0.9999)), r"betas\[1\] must be in \[0, 1\).*got 1\.0"),
        (dict(lr=1e-3, betas=(-0.1, 0.999, 0.9999)), r"betas\[0\] must be in \[0, 1\).*got -0\.1"),
        (dict(lr=1e-3, betas=(0.9, 0.999)), r"betas must be a sequence of 3 numbers, got \(0\.9, 0\.999\)"),
        (dict(lr=1e-3, eps=(-1e-30, 1e-16)), r"eps\[0\] must be a non-negative number.*got -1e-30"),
        (dict(lr=1e-3, clip_threshold=0.0), r"clip_threshold must be a positive number, got 0\.0"),
        (dict(lr=1e-3, weight_decay=-0.1), r"weight_decay must be a non-negative number, got -0\.1"),
        (dict(lr=1e-3, min_factor_size=-1), r"min_factor_size must be an int >= 0.*got -1"),
    ],
)
def test_invalid_hyperparameters_raise(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        CAME([nn.Parameter(torch.ones(2, 2))], **kwargs)


def test_invalid_group_override_raises():
    with pytest.raises(ValueError, match=r"weight_decay must be a non-negative number, got -1"):
        CAME([{"params": [nn.Parameter(torch.ones(2))], "weight_decay": -1}], lr=1e-3)


def _state_bytes(opt):
    return sum(t.numel() * t.element_size() for t in _state_tensors(opt))


def test_state_memory_about_half_of_adamw():
    p_came, p_adam = nn.Parameter(torch.zeros(768, 3072)), nn.Parameter(torch.zeros(768, 3072))
    came, adamw = CAME([p_came], lr=1e-3), torch.optim.AdamW([p_adam], lr=1e-3)
    for p, opt in ((p_came, came), (p_adam, adamw)):
        p.grad = torch.ones_like(p)
        opt.step()
    ratio = _state_bytes(came) / _state_bytes(adamw)
    assert ratio <= 0.51
    assert _state_bytes(came) == 4 * (768 * 3072 + 2 * (768 + 3072)) + 4  # mn + 2(m+n) + step
