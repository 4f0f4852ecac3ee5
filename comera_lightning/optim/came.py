"""CAME: Confidence-guided Adaptive Memory Efficient optimizer (Luo et al., ACL 2023; METHOD.md §4)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["CAME"]

# (n_batch, split): dims [0, n_batch) are a batch, [n_batch, split) the rows, [split, ndim) the
# columns of the matrix whose second moment is factored. ``None``: full (unfactored) moments.
Layout = tuple[int, int]

# The multi-tensor path stacks same-shape tensors below _STACK_BELOW elements (where kernel
# launches, not memory traffic, dominate), at most _STACK_NUMEL elements per stack.
_STACK_BELOW = 1 << 16
_STACK_NUMEL = 1 << 22


def factor_layout(shape: Sequence[int], min_factor_size: int = 0, factor_core_unfolding: bool = False) -> Layout | None:
    """How CAME factors the statistics of a parameter of ``shape`` (``None``: kept full)."""
    ndim = len(shape)
    if ndim < 2 or math.prod(shape) < min_factor_size:
        return None
    if factor_core_unfolding and ndim in (3, 4):
        return (0, 1)  # TT core (r_left, n, [m,] r_right): rows r_left, columns the rest
    return (ndim - 2, ndim - 1)


def state_layout(state: dict[str, Any], ndim: int) -> Layout | None:
    """The layout an existing CAME state was built with, read off its tensor shapes."""
    if "exp_avg_sq_row" not in state:
        return None
    split = state["exp_avg_sq_row"].dim()
    return (state["exp_avg_sq_col"].dim() - (ndim - split), split)


def _matrix_dims(shape: Sequence[int], layout: Layout) -> tuple[int, int, int]:
    n_batch, split = layout
    return math.prod(shape[:n_batch]), math.prod(shape[n_batch:split]), math.prod(shape[split:])


def _compute_dtype(param: Tensor) -> torch.dtype:
    return torch.float32 if param.dtype in (torch.float16, torch.bfloat16) else param.dtype


def _rank1_rsqrt(row: Tensor, col: Tensor, out: Tensor) -> Tensor:
    # rsqrt of the rank-1 estimate row_i col_j / mean(row), for (N, R) rows and (N, C) columns,
    # written into a spent (N, R, C) buffer: one full-size temporary per step, not three
    r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
    c_factor = col.rsqrt().unsqueeze(-2)
    return torch.mul(r_factor, c_factor, out=out)


def _stack(tensors: list[Tensor]) -> Tensor:
    # read-only stacked copy; a single tensor is just viewed (callers never write into it)
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)


def _check_number(name: str, value: Any, low: float, low_open: bool, high: float | None, text: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (high is None or value < high)
    if not ok:
        raise ValueError(f"CAME: {name} must be {text}, got {value!r}.")


def _check_group(group: dict[str, Any]) -> None:
    lr = group["lr"]
    lr_value = lr.item() if isinstance(lr, Tensor) and lr.numel() == 1 and lr.is_floating_point() else lr
    _check_number("lr", lr_value, 0.0, True, None, "a positive number (a float or a 1-element float tensor)")
    for name, size in (("betas", 3), ("eps", 2)):
        value = group[name]
        if not isinstance(value, (tuple, list)) or len(value) != size:
            raise ValueError(f"CAME: {name} must be a sequence of {size} numbers, got {value!r}.")
    for i, beta in enumerate(group["betas"]):
        _check_number(f"betas[{i}]", beta, 0.0, False, 1.0, f"in [0, 1) (betas={tuple(group['betas'])!r})")
    for i, eps in enumerate(group["eps"]):
        _check_number(f"eps[{i}]", eps, 0.0, False, None, f"a non-negative number (eps={tuple(group['eps'])!r})")
    _check_number("clip_threshold", group["clip_threshold"], 0.0, True, None, "a positive number")
    _check_number("weight_decay", group["weight_decay"], 0.0, False, None, "a non-negative number")
    size = group["min_factor_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"CAME: min_factor_size must be an int >= 0 (0 factors every tensor of 2+ dims), got {size!r}.")
    for name in ("factor_core_unfolding", "capturable"):
        if not isinstance(group[name], bool):
            raise ValueError(f"CAME: {name} must be True or False, got {group[name]!r}.")
    if group["foreach"] not in (None, True, False):
        raise ValueError(f"CAME: foreach must be None, True or False, got {group['foreach']!r}.")


class CAME(torch.optim.Optimizer):
    r"""CAME optimizer: Adafactor-style factored second moments plus a factored confidence term.

    For a parameter with gradient ``g`` (METHOD.md §4, no bias correction anywhere):

    1. ``r = β₂ r + (1-β₂) rowmean(g² + ε₁)``, ``c = β₂ c + (1-β₂) colmean(g² + ε₁)``,
       ``v = r cᵀ / mean(r)``; factored over the last two dims, leading dims are a batch.
    2. ``u = g / sqrt(v)``, then ``u ← u / max(1, RMS(u) / clip_threshold)``.
    3. ``m = β₁ m + (1-β₁) u``.
    4. ``U = (u - m)² + ε₂``; ``R``, ``C`` are its row/column means averaged with ``β₃``;
       ``S = R Cᵀ / mean(R)``.
    5. ``θ ← θ (1 - lr·weight_decay) - lr · m / sqrt(S)`` (decoupled decay on the pre-update
       weights, exactly as ``came-pytorch`` 0.1.3 does it).
    6. 1-D parameters keep a full ``v`` and take ``θ ← θ (1 - lr·weight_decay) - lr · m``.

    With the defaults this is numerically the algorithm of ``came_pytorch.CAME`` 0.1.3 (mind the
    argument order: here ``betas`` comes before ``eps``). Memory: ``mn + 2(m+n)`` numbers for an
    ``m×n`` matrix (exp_avg plus four factor vectors), about half of AdamW's ``2mn``.

    **Factoring policy for tensor-train cores** (opt-in; the defaults factor every tensor of
    two or more dims, as ``came-pytorch`` does). TT cores are tiny (a ``30×12×30`` core holds
    10,800 numbers; all cores of the tensorized paper encoder about 1 M), so factoring their
    statistics saves a few MB at most, next to hundreds of MB for a dense model. Meanwhile a
    rank-1 estimate over each ``12×30`` slice, with the left rank taken as a batch, averages
    together entries whose scales differ a lot (each rank slice is scaled by its bond's gate,
    and gates shrink during rank adaptation), which degrades the per-entry step sizes that make
    the optimizer adaptive. Hence:

    * ``min_factor_size``: a tensor of 2+ dims with fewer elements than this keeps a full
      second moment **and** a full confidence statistic (``θ ← θ - lr · m / sqrt(R)`` with
      ``R`` the elementwise average of ``U``). ``1 << 17`` keeps every core of the paper's models
      full (the largest, a rank-32 TTM embedding core, has 32·20·4·32 = 81,920 entries) while
      dense matrices (589,824 entries for 768×768) stay factored. Default 0: factor them all.
    * ``factor_core_unfolding``: a 3-D or 4-D tensor ``(r_left, n, [m,] r_right)`` that is
      factored is factored over its unfolding ``(r_left, n·[m·]r_right)`` instead of its last
      two dims: one statistic per left-rank slice, one per entry of the rest.

    All state is tensors (``step`` included) updated in place, and ``step()`` never reads a
    tensor value on the host, so it can be captured in a CUDA graph (pass ``capturable=True``
    so that ``step`` lives on the device; ``lr`` may then be a 1-element tensor that a
    scheduler updates in place). Half-precision parameters get fp32 state and fp32 math; the
    result is rounded once into the parameter. ``foreach=True`` or ``None`` (the default) runs
    the multi-tensor path (small same-shape tensors stacked, ``torch._foreach_*`` for the
    state), ``foreach=False`` the plain per-parameter loop, kept as the readable reference.
    Both give the same numbers.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float | Tensor,
        betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        eps: tuple[float, float] = (1e-30, 1e-16),
        clip_threshold: float = 1.0,
        weight_decay: float = 0.0,
        *,
        min_factor_size: int = 0,
        factor_core_unfolding: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=tuple(betas) if isinstance(betas, list) else betas,
            eps=tuple(eps) if isinstance(eps, list) else eps,
            clip_threshold=clip_threshold,
            weight_decay=weight_decay,
            min_factor_size=min_factor_size,
            factor_core_unfolding=factor_core_unfolding,
            foreach=foreach,
            capturable=capturable,
        )
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group, checking its hyper-parameters."""
        _check_group({**self.defaults, **param_group})
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            if not p.is_floating_point():
                self.param_groups.pop()
                raise ValueError(f"CAME: parameters must be real floating point, got one of dtype {p.dtype}.")

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    def init_state_(self, param: Tensor, group: dict[str, Any] | None = None) -> None:
        """(Re)create ``param``'s state as a fresh zero state, keeping its step count."""
        if group is None:
            group = next(g for g in self.param_groups if any(p is param for p in g["params"]))
        state = self.state[param]
        step = state.get("step")
        state.clear()
        dtype, device = _compute_dtype(param), param.device
        if not isinstance(step, Tensor):
            step = torch.zeros((), dtype=torch.float32, device=device if group["capturable"] else "cpu")
        state["step"] = step
        state["exp_avg"] = torch.zeros(param.shape, dtype=dtype, device=device)
        layout = factor_layout(param.shape, group["min_factor_size"], group["factor_core_unfolding"])
        if layout is None:
            state["exp_avg_sq"] = torch.zeros(param.shape, dtype=dtype, device=device)
            if param.dim() >= 2:
                state["exp_avg_res"] = torch.zeros(param.shape, dtype=dtype, device=device)
            return
        n_batch, split = layout
        row_shape, col_shape = param.shape[:split], param.shape[:n_batch] + param.shape[split:]
        for name in ("sq", "res"):
            state[f"exp_avg_{name}_row"] = torch.zeros(row_shape, dtype=dtype, device=device)
            state[f"exp_avg_{name}_col"] = torch.zeros(col_shape, dtype=dtype, device=device)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict, keeping fp32 state for half-precision parameters."""
        super().load_state_dict(state_dict)
        # torch casts floating state to the parameter dtype (bf16 state for bf16 weights): redo it
        # from the saved tensors. Copies, so the state never aliases the dict it was loaded from.
        saved_ids = [pid for group in state_dict["param_groups"] for pid in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)
        capturable = {id(p): g["capturable"] for g in self.param_groups for p in g["params"]}
        for pid, p in zip(saved_ids, params):
            saved = state_dict["state"].get(pid)
            if saved is None:
                continue
            state = self.state[p]
            for key, value in saved.items():
                if key == "step":
                    device = p.device if capturable[id(p)] else torch.device("cpu")
                    step = value if isinstance(value, Tensor) else torch.tensor(float(value))
                    state[key] = step.to(device=device, dtype=torch.float32, copy=True)
                elif isinstance(value, Tensor):
                    state[key] = value.to(device=p.device, dtype=_compute_dtype(p), copy=True)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimization step; ``closure`` re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if not group["capturable"] and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("CAME: build the optimizer with capturable=True to capture step() in a CUDA graph.")
            params = []
            for p in group["params"]:
                if p.grad is None or p.numel() == 0:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(
                        f"CAME does not support sparse gradients (parameter of shape {tuple(p.shape)}); "
                        "use a dense layer, e.g. nn.Embedding(..., sparse=False)."
                    )
                if not self.state[p]:
                    self.init_state_(p, group)
                params.append(p)
            if not params:
                continue
            if group["foreach"] is not False:
                self._step_foreach(group, params)
            else:
                for p in params:
                    self._step_single(group, p)
        return loss

    # ---- the readable reference: one parameter at a time -------------------------------------

    def _step_single(self, group: dict[str, Any], p: Tensor) -> None:
        beta1, beta2, beta3 = group["betas"]
        eps1, eps2 = group["eps"]
        state = self.state[p]
        exp_avg = state["exp_avg"]
        g = p.grad.to(exp_avg.dtype).contiguous()
        state["step"].add_(1)
        layout = state_layout(state, p.dim())

        if layout is None:
            exp_avg_sq = state["exp_avg_sq"]
            sq = torch.mul(g, g).add_(eps1)
            exp_avg_sq.mul_(beta2).add_(sq, alpha=1 - beta2)
            u = torch.rsqrt(exp_avg_sq, out=sq).mul_(g)
        else:
            B, R, C = _matrix_dims(p.shape, layout)
            g = g.view(B, R, C)
            exp_avg = exp_avg.view(B, R, C)
            sq = torch.mul(g, g).add_(eps1)
            row, col = state["exp_avg_sq_row"].view(B, R), state["exp_avg_sq_col"].view(B, C)
            row.mul_(beta2).add_(sq.mean(dim=-1), alpha=1 - beta2)
            col.mul_(beta2).add_(sq.mean(dim=-2), alpha=1 - beta2)
            u = _rank1_rsqrt(row, col, out=sq).mul_(g)

        divisor = torch.linalg.vector_norm(u).div_(math.sqrt(u.numel())).div_(group["clip_threshold"])
        u.div_(divisor.clamp_(min=1.0))
        exp_avg.mul_(beta1).add_(u, alpha=1 - beta1)

        if layout is None and "exp_avg_res" not in state:  # 1-D: no confidence term
            update = exp_avg.mul(group["lr"])
        else:
            res = u.sub_(exp_avg).square_().add_(eps2)  # u is spent: reuse its memory
            if layout is None:
                exp_avg_res = state["exp_avg_res"]
                exp_avg_res.mul_(beta3).add_(res, alpha=1 - beta3)
                update = torch.rsqrt(exp_avg_res, out=res).mul_(exp_avg)
            else:
                row, col = state["exp_avg_res_row"].view(B, R), state["exp_avg_res_col"].view(B, C)
                row.mul_(beta3).add_(res.mean(dim=-1), alpha=1 - beta3)
                col.mul_(beta3).add_(res.mean(dim=-2), alpha=1 - beta3)
                update = _rank1_rsqrt(row, col, out=res).mul_(exp_avg)
            update.mul_(group["lr"])

        target = p if p.dtype == exp_avg.dtype else p.to(exp_avg.dtype)
        if group["weight_decay"] != 0:
            target.mul_(1 - group["lr"] * group["weight_decay"])
        target.sub_(update.view(p.shape))
        if target is not p:
            p.copy_(target)

    # ---- the multi-tensor path --------------------------------------------------------------

    def _step_foreach(self, group: dict[str, Any], params: list[Tensor]) -> None:
        buckets: dict[tuple, list[Tensor]] = defaultdict(list)
        for p in params:
            state = self.state[p]
            layout = state_layout(state, p.dim())
            if layout is None:
                key = ("full" if "exp_avg_res" in state else "vector", p.device, p.dtype)
            else:
                key = ("factored", p.device, p.dtype, p.shape, layout)
            buckets[key].append(p)
        for key, bucket in buckets.items():
            torch._foreach_add_([self.state[p]["step"] for p in bucket], 1.0)
            if key[0] != "factored":
                self._foreach_unfactored(group, bucket)
                continue
            numel = bucket[0].numel()
            chunk = _STACK_NUMEL // numel if numel < _STACK_BELOW else 1
            for start in range(0, len(bucket), chunk):
                self._foreach_factored(group, bucket[start : start + chunk], key[4])

    def _foreach_unfactored(self, group: dict[str, Any], params: list[Tensor]) -> None:
        beta1, beta2, beta3 = group["betas"]
        eps1, eps2 = group["eps"]
        states = [self.state[p] for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        grads = [p.grad.to(m.dtype).contiguous() for p, m in zip(params, exp_avgs)]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]

        sq = torch._foreach_mul(grads, grads)
        torch._foreach_add_(sq, eps1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_add_(exp_avg_sqs, sq, alpha=1 - beta2)
        us = sq  # spent: reuse its memory
        torch._foreach_copy_(us, exp_avg_sqs)
        torch._foreach_rsqrt_(us)
        torch._foreach_mul_(us, grads)
        self._foreach_clip_(us, group["clip_threshold"])
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, us, alpha=1 - beta1)

        if "exp_avg_res" not in states[0]:  # 1-D: no confidence term
            updates = torch._foreach_mul(exp_avgs, group["lr"])
        else:
            res = us
            torch._foreach_sub_(res, exp_avgs)
            torch._foreach_pow_(res, 2.0)
            torch._foreach_add_(res, eps2)
            exp_avg_res = [s["exp_avg_res"] for s in states]
            torch._foreach_mul_(exp_avg_res, beta3)
            torch._foreach_add_(exp_avg_res, res, alpha=1 - beta3)
            updates = res
            torch._foreach_copy_(updates, exp_avg_res)
            torch._foreach_rsqrt_(updates)
            torch._foreach_mul_(updates, exp_avgs)
            torch._foreach_mul_(updates, group["lr"])
        self._foreach_apply_(group, params, updates)

    def _foreach_factored(self, group: dict[str, Any], params: list[Tensor], layout: Layout) -> None:
        beta1, beta2, beta3 = group["betas"]
        eps1, eps2 = group["eps"]
        k, shape = len(params), params[0].shape
        B, R, C = _matrix_dims(shape, layout)
        states = [self.state[p] for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        dtype = exp_avgs[0].dtype
        grads = _stack([p.grad.to(dtype) for p in params]).contiguous().view(k * B, R, C)

        def update_factors(name: str, beta: float, values: Tensor) -> tuple[Tensor, Tensor]:
            rows, cols = [s[f"exp_avg_{name}_row"] for s in states], [s[f"exp_avg_{name}_col"] for s in states]
            torch._foreach_mul_(rows, beta)
            torch._foreach_add_(rows, values.mean(dim=-1).view(k, *rows[0].shape).unbind(0), alpha=1 - beta)
            torch._foreach_mul_(cols, beta)
            torch._foreach_add_(cols, values.mean(dim=-2).view(k, *cols[0].shape).unbind(0), alpha=1 - beta)
            return _stack(rows).view(k * B, R), _stack(cols).view(k * B, C)

        buffer = torch.mul(grads, grads).add_(eps1)
        row, col = update_factors("sq", beta2, buffer)
        us = _rank1_rsqrt(row, col, out=buffer).mul_(grads)
        self._foreach_clip_(list(us.view(k, -1).unbind(0)), group["clip_threshold"])
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, us.view(k, *shape).unbind(0), alpha=1 - beta1)
        exp_avg = _stack(exp_avgs).view(k * B, R, C)
        row, col = update_factors("res", beta3, us.sub_(exp_avg).square_().add_(eps2))
        updates = _rank1_rsqrt(row, col, out=us).mul_(exp_avg).mul_(group["lr"])
        self._foreach_apply_(group, params, list(updates.view(k, *shape).unbind(0)))

    @staticmethod
    def _foreach_clip_(us: list[Tensor], clip_threshold: float) -> None:
        divisors = torch._foreach_norm(us)
        torch._foreach_div_(divisors, [math.sqrt(u.numel()) for u in us])
        torch._foreach_div_(divisors, clip_threshold)
        torch._foreach_clamp_min_(divisors, 1.0)
        torch._foreach_div_(us, divisors)

    def _foreach_apply_(self, group: dict[str, Any], params: list[Tensor], updates: list[Tensor]) -> None:
        dtype = updates[0].dtype
        targets = params if params[0].dtype == dtype else [p.to(dtype) for p in params]
        if group["weight_decay"] != 0:
            torch._foreach_mul_(targets, 1 - group["lr"] * group["weight_decay"])
        torch._foreach_sub_(targets, updates)
        if targets is not params:
            torch._foreach_copy_(params, targets)
