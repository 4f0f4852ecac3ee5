"""A compressed model as served: its exported program's file bytes and batch-1 / batch-32 latency (issue #52).

Every system goes through ``comera_lightning.export`` (a plain model is exported as it is; a pruned one with its masks
folded in, so its zeros are stored like any weight: unstructured sparsity saves nothing in a dense program). The
program is loaded back with ``torch.export.load`` and timed on CPU: one warm-up call, then the median of ``rounds``
calls per batch size, each system after the other in one process.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

BATCHES = (1, 32)


class _Logits(nn.Module):
    """A Hugging Face causal LM called on token ids, returning its logits (the program's one output)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


def without_masks(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in eval mode; any ``torch.nn.utils.prune`` mask is folded into its weight first, in
    ``model`` itself (a pruned module cannot be copied; the benchmark is done training it)."""
    import torch.nn.utils.prune as prune

    from benchmarks.quality.baselines import pruned

    for module, name in list(pruned(model)):
        prune.remove(module, name)
    return copy.deepcopy(model).eval()


@torch.no_grad()
def served(model: nn.Module, block: int, vocab: int, rounds: int = 10) -> dict[str, Any]:
    """File bytes of a causal LM's exported program and its median ms per call at each of ``BATCHES``."""
    ids = torch.randint(0, vocab, (max(BATCHES), block), generator=torch.Generator().manual_seed(0))
    return served_program(_Logits(without_masks(model)), lambda batch: (ids[:batch],), rounds)


@torch.no_grad()
def served_program(module: nn.Module, inputs_of: Callable[[int], tuple], rounds: int = 10) -> dict[str, Any]:
    """File bytes of ``module``'s exported program (traced on ``inputs_of(2)``) and its median ms per call on
    ``inputs_of(batch)`` at each of ``BATCHES``."""
    from comera_lightning import export

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.pt2"
        export(module, inputs_of(2), path)
        result: dict[str, Any] = {"file_bytes": path.stat().st_size}
        program = torch.export.load(path).module()
    for batch in BATCHES:
        inputs = inputs_of(batch)
        program(*inputs)
        samples = []
        for _ in range(rounds):
            started = time.perf_counter()
            program(*inputs)
            samples.append(time.perf_counter() - started)
        result[f"ms_batch{batch}"] = round(1000 * statistics.median(samples), 3)
    return result
