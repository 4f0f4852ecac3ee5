"""The compatibility matrix's steps for one family, in process: tensorize, train, evaluate, prune, save, export, compile.

Only public functions are used: ``tensorize``, ``export``, ``comera_lightning.rank`` (``tt_layers``, ``prune_``,
``compression_stats``) and the documented ``TTModule.gates``. ``run_family`` records what each step gave in a
``ZooRun``; the reload in a fresh process is ``tests/scripts/zoo_reload_script.py`` (one process for every family);
``compiled_step`` is the ``torch.compile`` check, on a model of its own.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from comera_lightning import TensorizeReport, export, tensorize
from comera_lightning.rank import compression_stats, prune_, tt_layers
from tests.helpers.zoo_families import Family

TRAIN_STEPS = 4
#: Exported factors are contracted in another order than the TT layers' forward: float32 rounding only.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


@dataclass
class ZooRun:
    """What each step of the matrix gave for one family."""

    family: Family
    report: TensorizeReport
    losses: list[float] = field(default_factory=list)
    tt_grads: dict[str, bool] = field(default_factory=dict)  # TT layer -> every parameter got a finite gradient
    eval_logits: torch.Tensor | None = None
    removed: int = 0
    loss_after_prune: float = float("nan")
    compression_after_prune: tuple[float, float] = (0.0, 0.0)  # TT layers, whole model
    export_error: float = float("inf")
    export_note: str = ""  # how torch.export traced it
    seconds: dict[str, float] = field(default_factory=dict)

    def trained_ok(self) -> bool:
        """Something swapped; finite losses that went down; gradients in every TT layer; the prune removed parameters."""
        losses = [*self.losses, self.loss_after_prune]
        return (bool(self.report.swapped) and all(math.isfinite(x) for x in losses) and min(self.losses[1:]) < self.losses[0]
                and bool(self.tt_grads) and all(self.tt_grads.values()) and self.removed > 0
                and self.eval_logits is not None and bool(torch.isfinite(self.eval_logits).all()))

    def tolerance(self) -> float:
        """How far another contraction order may move the eval logits (float32 rounding)."""
        return TOLERANCE["atol"] + TOLERANCE["rtol"] * float(self.eval_logits.abs().max())

    def export_ok(self) -> bool:
        """The exported program's outputs equal the eval logits."""
        return self.export_error <= self.tolerance()


def target_for(output: torch.Tensor) -> torch.Tensor:
    """A fixed random regression target shaped like ``output`` (any family's output can fit it)."""
    return torch.randn(output.shape, generator=torch.Generator().manual_seed(1), dtype=output.dtype)


def loss_of(model: nn.Module, inputs: tuple, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the model's output against ``target``."""
    return F.mse_loss(model(*inputs), target)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: tuple, target: torch.Tensor) -> float:
    optimizer.zero_grad()
    loss = loss_of(model, inputs, target)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _tt_grads(model: nn.Module) -> dict[str, bool]:
    return {name: all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in layer.parameters())
            for name, layer in tt_layers(model)}


def kill_half_the_ranks_(model: nn.Module) -> None:
    """Gates of the upper half of every bond set to 0 (below any threshold): what a late stage does, at once."""
    with torch.no_grad():
        for _, layer in tt_layers(model):
            for gate in layer.gates:
                gate[max(1, gate.numel() // 2):] = 0.0


def run_family(family: Family, out: Path) -> ZooRun:
    """Every in-process step for ``family``; the state, inputs and eval logits are saved to ``out/<key>.pt``."""
    clock = _Clock()
    model, inputs = family.build(), family.inputs(0)
    run = ZooRun(family, tensorize(model, **family.tensorize_options()))
    clock.lap(run, "tensorize")
    model.train()
    target = target_for(model(*inputs).detach())
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    run.losses = [_step(model, optimizer, inputs, target) for _ in range(TRAIN_STEPS)]
    run.tt_grads = _tt_grads(model)
    clock.lap(run, "train")
    kill_half_the_ranks_(model)
    run.removed = prune_(model, [optimizer]).removed
    run.loss_after_prune = _step(model, optimizer, inputs, target)  # the optimizer's state was sliced with the cores
    stats = compression_stats(model)
    run.compression_after_prune = (stats.tt_compression, stats.model_compression)
    model.eval()
    with torch.no_grad():
        run.eval_logits = model(*inputs)
    clock.lap(run, "prune+eval")
    program_inputs = family.export_inputs(model, inputs) if family.export_inputs else inputs
    program = export(model, program_inputs, out / f"{family.key}.pt2")
    with torch.no_grad():
        exported = program.module()(*program_inputs)
    run.export_error = float((exported.reshape(-1) - run.eval_logits.reshape(-1)).abs().max())
    inputs_vary = any(isinstance(d, torch.SymInt) for node in program.graph.nodes if node.op == "placeholder"
                      and isinstance(node.meta.get("val"), torch.Tensor) for d in node.meta["val"].shape)
    shapes = "dynamic shapes" if inputs_vary else "static shapes"
    run.export_note = f"draft_export, {shapes}" if hasattr(program, "_report") else shapes
    torch.save({"state": model.state_dict(), "inputs": inputs, "program_inputs": program_inputs,
                "expected": run.eval_logits}, out / f"{family.key}.pt")
    clock.lap(run, "export+save")
    return run


def compiled_step(family: Family) -> tuple[float, bool]:
    """The tensorized model under ``torch.compile(backend="aot_eager")`` trains one step: (loss, every TT layer got gradients)."""
    model, inputs = family.build(), family.inputs(0)
    tensorize(model, **family.tensorize_options())
    model.train()
    target = target_for(model(*inputs).detach())
    compiled = torch.compile(model, backend="aot_eager")
    loss = loss_of(compiled, inputs, target)
    loss.backward()
    torch.optim.Adam(model.parameters(), lr=5e-3).step()
    return float(loss), all(_tt_grads(model).values())


class _Clock:
    def __init__(self) -> None:
        self.last = time.perf_counter()

    def lap(self, run: ZooRun, step: str) -> None:
        now = time.perf_counter()
        run.seconds[step], self.last = now - self.last, now
