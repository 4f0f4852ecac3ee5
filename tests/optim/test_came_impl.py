"""CAME implementation: foreach equals the loop, state dicts, half precision, graph safety, argument checks, memory."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from comera_lightning.optim import CAME
from tests.helpers.came_helpers import make_params, mixed_params, set_grads, state_tensors, train


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foreach_matches_loop(dtype):
    def make(foreach):
        params = mixed_params(dtype)
        groups = [
            {"params": params[:8]},
            {"params": params[8:], "factor_core_unfolding": True, "min_factor_size": 5, "weight_decay": 0.0},
        ]
        return params, CAME(groups, lr=1e-2, weight_decay=0.05, foreach=foreach)

    (pa, oa), (pb, ob) = make(False), make(True)
    train(oa, pa, 20, zero_rows=1)
    train(ob, pb, 20, zero_rows=1)
    for a, b in zip(pa, pb):
        assert torch.equal(a, b)
        for key, value in oa.state[a].items():
            assert torch.equal(value, ob.state[b][key]), key


def test_foreach_chunks_large_buckets(monkeypatch):
    import comera_lightning.optim.came_foreach as foreach_module

    (pa, pb) = mixed_params(torch.float32), mixed_params(torch.float32)
    oa, ob = CAME(pa, lr=1e-2, foreach=True), CAME(pb, lr=1e-2, foreach=False)
    monkeypatch.setattr(foreach_module, "_STACK_NUMEL", 70)  # two (6, 5) tensors per chunk
    monkeypatch.setattr(foreach_module, "_STACK_BELOW", 50)  # (4, 3, 5) and (2, 3, 4, 2) one at a time
    train(oa, pa, 5)
    train(ob, pb, 5)
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_roundtrip_bit_identical(foreach, dtype):
    def make():
        params = mixed_params(dtype)
        groups = [{"params": params[:6]}, {"params": params[6:], "min_factor_size": 10, "lr": 3e-3}]
        return params, CAME(groups, lr=1e-2, weight_decay=0.01, foreach=foreach)

    straight, opt = make()
    train(opt, straight, 12, seed=5)

    first, opt1 = make()
    gen = torch.Generator().manual_seed(5)
    for _ in range(6):
        set_grads(first, gen)
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
    assert all(v.dtype in (torch.float32, torch.float64) for v in state_tensors(opt2))  # fp32 state kept
    for _ in range(6):
        set_grads(resumed, gen)
        opt2.step()
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)
    for a, b in zip(straight, resumed):
        for key, value in opt.state[a].items():
            assert torch.equal(value, opt2.state[b][key]), key


def test_no_shared_storage():
    params = mixed_params(torch.bfloat16)
    opt = CAME(params, lr=1e-2, foreach=True)
    train(opt, params, 2)
    loaded = CAME(mixed_params(torch.bfloat16), lr=1e-2)
    loaded.load_state_dict(opt.state_dict())
    for optimizer in (opt, loaded):
        ptrs = [t.untyped_storage().data_ptr() for t in state_tensors(optimizer)]
        assert len(ptrs) == len(set(ptrs))
    # loading copies: the two optimizers never alias each other either
    assert not {t.untyped_storage().data_ptr() for t in state_tensors(opt)} & {
        t.untyped_storage().data_ptr() for t in state_tensors(loaded)
    }


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_params_stay_finite_with_zero_gradient_rows(foreach, dtype):
    params = make_params([(16, 32), (4, 8, 6), (32,)], dtype)
    start = [p.detach().clone() for p in params]
    opt = CAME(params, lr=1e-3, foreach=foreach)
    train(opt, params, 150, zero_rows=slice(0, 4))
    for p, p0 in zip(params, start):
        assert p.dtype == dtype and torch.isfinite(p).all()
        assert all(v.dtype == torch.float32 for v in opt.state[p].values())
        if p.dim() >= 2:
            assert torch.equal(p[..., :4, :], p0[..., :4, :])  # no gradient, no decay: untouched
            assert not torch.equal(p[..., 4:, :], p0[..., 4:, :])


@pytest.mark.parametrize("foreach", [False, True])
def test_step_never_reads_tensors_on_host(foreach, monkeypatch):
    params = mixed_params(torch.bfloat16)
    opt = CAME(params, lr=torch.tensor(1e-2), weight_decay=0.1, foreach=foreach, capturable=True)
    gen = torch.Generator().manual_seed(0)

    def forbidden(*args, **kwargs):
        raise AssertionError("host synchronisation inside CAME.step")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    for _ in range(3):  # includes the lazy state initialisation
        set_grads(params, gen)
        opt.step()
    monkeypatch.undo()
    assert all(torch.isfinite(p).all() for p in params)


@pytest.mark.parametrize("foreach", [False, True])
def test_non_contiguous_gradients(foreach):
    pa, pb = make_params([(6, 5), (3, 6, 5)]), make_params([(6, 5), (3, 6, 5)])
    oa, ob = CAME(pa, lr=1e-2, foreach=foreach), CAME(pb, lr=1e-2, foreach=foreach)
    for _ in range(3):
        for a, b in zip(pa, pb):
            g = torch.randn(a.shape[::-1]).permute(*reversed(range(a.dim())))
            a.grad, b.grad = g, g.contiguous()
        oa.step()
        ob.step()
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))


def test_tensor_lr_matches_float_lr():
    pa, pb = mixed_params(torch.float32), mixed_params(torch.float32)
    oa = CAME(pa, lr=1e-2, weight_decay=0.1)
    ob = CAME(pb, lr=torch.tensor(1e-2), weight_decay=0.1, capturable=True)
    train(oa, pa, 5)
    train(ob, pb, 5)
    for a, b in zip(pa, pb):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_grad_none_is_skipped_and_sparse_grad_raises():
    used, unused = make_params([(3, 4), (5,)])
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
    return sum(t.numel() * t.element_size() for t in state_tensors(opt))


def test_state_memory_about_half_of_adamw():
    p_came, p_adam = nn.Parameter(torch.zeros(768, 3072)), nn.Parameter(torch.zeros(768, 3072))
    came, adamw = CAME([p_came], lr=1e-3), torch.optim.AdamW([p_adam], lr=1e-3)
    for p, opt in ((p_came, came), (p_adam, adamw)):
        p.grad = torch.ones_like(p)
        opt.step()
    ratio = _state_bytes(came) / _state_bytes(adamw)
    assert ratio <= 0.51
    assert _state_bytes(came) == 4 * (768 * 3072 + 2 * (768 + 3072)) + 4  # mn + 2(m+n) + step
