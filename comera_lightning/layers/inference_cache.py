"""Reusing a TT layer's contracted factors at inference, until any of its parameters changes.

A TT layer contracts its cores into two factors (``TTLinear``) or two half tables
(``TTEmbedding``, when that lookup is the cheaper one) on every call; a ``TTEmbedding`` also
materialises its hot rows at inference. The cores do not change between inference calls, so
the results are kept and reused, keyed on everything that could change them:

* each core, gate and ``alive`` mask, by identity (a weak reference: ``prune_``,
  ``load_cores_`` and resizing on load put new tensors in place) and by ``tensor._version``
  (bumped by every in-place write: optimizer steps, ``load_state_dict``'s ``copy_``,
  ``gate[...] = 0``), ``data_ptr`` (``param.data = ...``), shape, dtype and device;
* the gate threshold and whether ``torch.inference_mode`` is on (its tensors may not be reused
  outside it in every way).

Nothing is cached while autograd could need the graph (grad mode on), in training mode (the
forward updates the ``alive`` masks there), while tracing/compiling (the cache would bake
constants into the graph) or during CUDA-graph capture. ``train()`` (entering training) drops the cache.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["InferenceCache", "caching_allowed"]


def caching_allowed(training: bool) -> bool:
    """Whether a layer may serve cached factors now: eval mode, no autograd, eager, not capturing."""
    if training or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _signature(tensors: Sequence[torch.Tensor], threshold: float) -> tuple:
    # (a list comprehension: this runs on every served batch, ~100 tensors for a Criteo collection)
    return (*[(t._version, t.data_ptr(), t.shape, t.dtype, t.device) for t in tensors], threshold, torch.is_inference_mode_enabled())


@dataclass
class InferenceCache:
    """Values computed from ``tensors`` at one state of theirs; valid while every tensor is the same and unchanged."""

    refs: list[weakref.ref]
    signature: tuple
    values: dict[Hashable, object] = field(default_factory=dict)

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor], threshold: float) -> "InferenceCache":
        return cls([weakref.ref(t) for t in tensors], _signature(tensors, threshold))

    def matches(self, tensors: Sequence[torch.Tensor], threshold: float) -> bool:
        """True when ``tensors`` are the very tensors cached, in the same state."""
        if len(self.refs) != len(tensors) or not all(map(operator.is_, [ref() for ref in self.refs], tensors)):
            return False
        return self.signature == _signature(tensors, threshold)

    def discard(self, key: Hashable) -> None:
        """Forget the value under ``key`` (it is recomputed on the next ``get``)."""
        self.values.pop(key, None)

    def get(self, key: Hashable, compute: Callable[[], object]) -> object:
        if key not in self.values:
            self.values[key] = compute()
        return self.values[key]
