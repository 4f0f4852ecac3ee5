"""Sharded TorchRec state <-> whole tensors: gather for one plain checkpoint, copy back into local shards on load.

A table sharded by ``DistributedModelParallel`` appears in ``state_dict()`` (and in the fused
optimizer's state) as a ``ShardedTensor`` whose local shards are views of the live storage.
Gathering every one of them to rank 0 gives a checkpoint identical in layout to an unsharded run's
(so it resumes, tests and exports on any number of processes); loading copies each rank's slices
of the whole tensor into its own shards, for any sharding type (table-, column- or row-wise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor

__all__ = ["copy_into_shards", "gather_sharded", "is_sharded"]


def is_sharded(value: Any) -> bool:
    """Whether ``value`` is a ``ShardedTensor`` (a table spread over ranks)."""
    return isinstance(value, ShardedTensor)


def gather_sharded(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with every ``ShardedTensor`` (nested dicts included) gathered whole; collective, call on every rank.

    The ranks need not hold the same keys (a fused optimizer lists only the tables a rank owns):
    each sends its local shards with their offsets, and rank 0 assembles the whole tensors. Rank 0
    gets the complete state; the other ranks get their plain values only (they write no checkpoint).
    """
    plain, shards = _split_sharded(state)
    received = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(shards, received, dst=0)
    if received is None:
        return plain
    whole: dict[tuple[str, ...], torch.Tensor] = {}
    for path, size, dtype, offsets, tensor in (entry for rank_shards in received for entry in rank_shards):
        target = whole.setdefault(path, torch.zeros(size, dtype=dtype))
        target[tuple(slice(o, o + n) for o, n in zip(offsets, tensor.shape))] = tensor
    for path, tensor in whole.items():
        node = plain
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = tensor
    return plain


def _split_sharded(state: Mapping[str, Any], path: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[tuple]]:
    """The plain part of ``state`` and a list of (key path, whole size, dtype, offsets, local tensor) of its shards."""
    plain: dict[str, Any] = {}
    shards: list[tuple] = []
    for key, value in state.items():
        if is_sharded(value):
            for shard in value.local_shards():
                shards.append((path + (key,), tuple(value.size()), value.dtype, tuple(shard.metadata.shard_offsets),
                               shard.tensor.detach().cpu()))
        elif isinstance(value, Mapping):
            plain[key], nested = _split_sharded(value, path + (key,))
            shards.extend(nested)
        else:
            plain[key] = value
    return plain, shards


def copy_into_shards(live: Mapping[str, Any], whole: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Copy each rank's slices of the whole tensors in ``whole`` into the ``ShardedTensor`` s of ``live``.

    ``live`` is a fresh ``state_dict()`` (of the module or the fused optimizer) whose shards view the
    real storage; nested dicts are followed. Returns the keys copied (``prefix``-joined for nested
    ones). A whole tensor of the wrong size raises, naming the key.
    """
    copied: list[str] = []
    for key, target in live.items():
        if key not in whole:
            continue
        source = whole[key]
        if is_sharded(target):
            if tuple(source.shape) != tuple(target.size()):
                raise ValueError(
                    f"{prefix}{key}: the checkpoint holds a tensor of shape {tuple(source.shape)} but the sharded "
                    f"table here is {tuple(target.size())}; it was saved from a model with other table sizes."
                )
            for shard in target.local_shards():
                rows = tuple(slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))
                with torch.no_grad():
                    shard.tensor.copy_(source[rows])
            copied.append(prefix + key)
        elif isinstance(target, Mapping) and isinstance(source, Mapping):
            copied.extend(copy_into_shards(target, source, f"{prefix}{key}."))
    return copied
