"""Shared helpers of the CAME tests: seeded parameters and gradients, a training loop, state tensors."""

from __future__ import annotations

import torch
from torch import nn


def make_params(shapes, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64).to(dtype)) for s in shapes]


def set_grads(params, gen, zero_rows=None):
    for p in params:
        g = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        if zero_rows is not None and p.dim() >= 2:
            g[..., zero_rows, :] = 0
        p.grad = g.to(p.dtype)


def train(opt, params, steps, seed=1, zero_rows=None):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        set_grads(params, gen, zero_rows)
        opt.step()


def state_tensors(opt):
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def mixed_params(dtype):
    shapes = [(6, 5), (6, 5), (6, 5), (4, 3, 5), (4, 3, 5), (2, 3, 4, 2), (9,), (9,), (3,), (2, 2), (3, 2, 2)]
    return make_params(shapes, dtype)
