"""CAME: Confidence-guided Adaptive Memory Efficient optimizer (Luo et al., ACL 2023; docs/METHOD.md §4).

The optimizer class: hyper-parameters, state creation and loading, and ``step()``, which runs
:func:`~comera_lightning.optim.came_foreach.step_foreach` or the per-parameter reference
:func:`~comera_lightning.optim.came_single.step_single`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from comera_lightning.optim.came_foreach import step_foreach
from comera_lightning.optim.came_layout import Layout, compute_dtype, factor_layout, state_layout
from comera_lightning.optim.came_single import step_single

__all__ = ["CAME", "Layout", "factor_layout", "state_layout"]


def _check_number(name: str, value: Any, low: float, low_open: bool, high: float | None, text: str) -> None:
    """Raise ValueError unless ``value`` is a finite real number in the range given."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (high is None or value < high)
    if not ok:
        raise ValueError(f"CAME: {name} must be {text}, got {value!r}.")


def _check_group(group: dict[str, Any]) -> None:
    """Raise ValueError naming the first hyper-parameter of ``group`` that is out of range."""
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

    For a parameter with gradient ``g`` (docs/METHOD.md §4, no bias correction anywhere):

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
        dtype, device = compute_dtype(param), param.device
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
                    state[key] = value.to(device=p.device, dtype=compute_dtype(p), copy=True)

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
                step_foreach(self.state, group, params)
            else:
                for p in params:
                    step_single(group, p, self.state[p])
        return loss
