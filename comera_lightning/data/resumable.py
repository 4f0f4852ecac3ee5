"""Training loaders that resume mid-epoch in the order an uninterrupted run would have used.

Lightning restores a loader's position only when the loader is stateful (``state_dict`` /
``load_state_dict``); a plain ``RandomSampler`` also reshuffles from its generator's *current*
state, so a resumed run sees other batches than the run it continues. Here the order of epoch
``e`` is a function of ``(seed, e)`` (Lightning calls ``set_epoch``), and a resumed loader skips
the batches the checkpointed run had already trained on (their indices only: nothing is loaded).
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler

__all__ = ["EpochShuffleSampler", "ResumableDataLoader", "record_consumed_batches"]

_KIND = "comera_lightning.ResumableDataLoader"
_DRAWS_PER_EPOCH = 2  # RandomSampler's: the epoch's permutation, then an empty remainder drawn from a second one


class EpochShuffleSampler(RandomSampler):
    """``RandomSampler`` whose epoch-``e`` order is a function of ``(seed, e)``.

    The same orders as ``RandomSampler(data, generator=torch.Generator().manual_seed(seed))``
    iterated through whole epochs (it draws two permutations an epoch and uses the first), but addressable: after ``set_epoch(e)`` (Lightning calls it each
    epoch) the order no longer depends on how many epochs this process has iterated. Without
    ``set_epoch`` each iteration is the next epoch. Being a ``RandomSampler``, Lightning replaces
    it with a ``DistributedSampler`` (itself seeded by epoch) under DDP.
    """

    def __init__(self, data_source: Sized, seed: int = 0) -> None:
        super().__init__(data_source)
        self.seed = seed
        self.epoch: int | None = None
        self._iterations = 0
        self._cached: tuple[int, torch.Tensor] | None = None  # (epochs drawn, generator state after them)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle as epoch ``epoch`` of an uninterrupted run."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch if self.epoch is not None else self._iterations
        self._iterations = epoch + 1
        yield from self._permutation(epoch).tolist()

    def _permutation(self, epoch: int) -> torch.Tensor:
        n, generator = len(self.data_source), torch.Generator()
        drawn = 0
        if self._cached is not None and self._cached[0] <= epoch:
            drawn = self._cached[0]
            generator.set_state(self._cached[1])
        else:
            generator.manual_seed(self.seed)
        for _ in range(_DRAWS_PER_EPOCH * (epoch - drawn)):  # earlier epochs' draws, only to advance the generator
            torch.randperm(n, generator=generator)
        order = torch.randperm(n, generator=generator)
        torch.randperm(n, generator=generator)
        self._cached = (epoch + 1, generator.get_state())
        return order


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` that Lightning can checkpoint and restore mid-epoch.

    ``state_dict`` holds how many batches of the current epoch the training loop consumed (filled
    in by :class:`~comera_lightning.ComeraCallback` from Lightning's own batch counter, since the
    loader cannot tell a consumed batch from a prefetched one); after ``load_state_dict`` the next
    iteration skips those batches' indices. A state saved after the epoch's last batch skips
    nothing: the next iteration is the next epoch.

    Its own ``generator`` (seeded 0 unless given) draws each iteration's worker seed, so iterating
    never consumes the global RNG, whose state the callback restores on resume.
    """

    def __init__(self, *args: Any, generator: torch.Generator | None = None, **kwargs: Any) -> None:
        super().__init__(*args, generator=generator if generator is not None else torch.Generator().manual_seed(0), **kwargs)
        self._skip = 0  # batches to skip at the next iteration
        self._skipping_now = 0  # set only while that iteration's iterator is being built
        self._generator_at_iteration_start = self.generator.get_state()

    def state_dict(self) -> dict[str, Any]:
        """The generator's states; ``record_consumed_batches`` adds the consumed count at checkpoint time."""
        return {"kind": _KIND, "consumed": None, "generator_at_iteration_start": self._generator_at_iteration_start,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Skip the batches the checkpointed run had consumed in its epoch (none when that epoch was complete)."""
        if state.get("kind") != _KIND:
            raise ValueError(f"ResumableDataLoader cannot load a loader state of another kind: {sorted(state)}.")
        consumed = state.get("consumed") or 0
        self._skip = consumed if consumed < len(self) else 0
        # Mid-epoch: redraw that iteration's worker seed; after a whole epoch: continue after it.
        self.generator.set_state(state["generator_at_iteration_start"] if self._skip else state["generator"])

    def __iter__(self) -> Any:
        self._generator_at_iteration_start = self.generator.get_state()
        self._skipping_now, self._skip = self._skip, 0
        try:
            return super().__iter__()
        finally:
            self._skipping_now = 0

    @property
    def _index_sampler(self) -> Any:
        # A new iterator reads this once (``len(self)`` reads it too, so skip only while ``__iter__`` builds one).
        sampler = super()._index_sampler
        return _Skipping(sampler, self._skipping_now) if self._skipping_now else sampler


class _Skipping(Sampler):
    """``sampler`` without its first ``skip`` items (its length unchanged: Lightning counts the epoch's batches itself)."""

    def __init__(self, sampler: Any, skip: int) -> None:
        self.sampler, self.skip = sampler, skip

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.sampler)
        for _ in range(self.skip):
            next(iterator, None)
        yield from iterator

    def __len__(self) -> int:
        return len(self.sampler)


def record_consumed_batches(loader_states: list[dict[str, Any]], consumed: int) -> None:
    """Write the batches the loop consumed this epoch into the ``ResumableDataLoader`` states of a checkpoint."""
    for state in loader_states:
        if isinstance(state, dict) and state.get("kind") == _KIND:
            state["consumed"] = consumed
