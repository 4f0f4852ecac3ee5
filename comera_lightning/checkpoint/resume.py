"""What an exact resume needs beyond Lightning's own restore (docs/DESIGN_FLOW.md "Checkpoints and resume").

* The random number generators: Lightning does not save them, so dropout and masking after a
  resume draw other numbers than the run that was interrupted. ``capture_rng_state`` /
  ``restore_rng_state`` carry Python's, NumPy's and torch's (CPU and CUDA) generators.
* A checkpoint written on an epoch's last batch (``ModelCheckpoint(every_n_train_steps=...)``,
  before that epoch's validation and ``on_train_epoch_end``): Lightning resumes it as a finished
  epoch and runs neither. ``missed_epoch_end`` detects it; ``run_missed_validation`` runs the
  validation the interrupted run would have run there.
* :class:`ResumeState` holds what the callback's checkpoint brings back until the moment it is due.
"""

from __future__ import annotations

import random
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

__all__ = ["ResumeState", "capture_rng_state", "missed_epoch_end", "restore_rng_state", "run_missed_validation"]


def capture_rng_state() -> dict[str, Any]:
    """This process's generator states (CUDA's only when CUDA has been initialised)."""
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gaussian)  # weights_only-loadable
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what ``capture_rng_state`` returned (CUDA's when both sides have the same devices)."""
    random.setstate(state["python"])
    kind, keys, position, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def missed_epoch_end(trainer: pl.Trainer, epochs_ended: int) -> bool:
    """Whether Lightning skipped the end of the epoch before ``trainer.current_epoch`` on resume.

    ``epochs_ended``: how many ``on_train_epoch_end`` calls the checkpointed run had made.
    """
    return trainer.current_epoch == epochs_ended + 1


def run_missed_validation(trainer: pl.Trainer, epoch: int) -> bool:
    """Run the validation that epoch ``epoch``'s end would have run; False when it would have run none."""
    loop = trainer.fit_loop.epoch_loop.val_loop
    every = trainer.check_val_every_n_epoch
    if not trainer.enable_validation or every is None or (epoch + 1) % every != 0:
        return False
    if isinstance(trainer.val_check_interval, int) and trainer.num_training_batches % trainer.val_check_interval:
        return False  # the interval does not land on the epoch's last batch
    trainer.validating = True
    loop.restarting = False
    try:
        loop.run()
    finally:
        trainer.training = True
    return True


def repair_skipped_epoch_start(trainer: pl.Trainer) -> bool:
    """Count the start of the running epoch where Lightning skipped it; True when it did.

    Resumed from a checkpoint saved at an epoch's last batch, Lightning (2.6) starts the next epoch without its
    ``on_train_epoch_start`` hooks or its started count (the callback runs its own hook with the missed epoch end),
    so a checkpoint saved in that epoch would read as one not yet begun and a resume from it would replay the epoch.
    Within an epoch Lightning counts one more epoch started than completed, except after that skip.
    """
    progress = trainer.fit_loop.epoch_progress
    if progress.total.started != progress.total.completed:
        return False
    progress.increment_ready()
    progress.increment_started()
    return True


class ResumeState:
    """A checkpoint's RNG states and L₀ running mean, held from ``load_state_dict`` until training starts.

    ``start`` puts them back; ``hold_rng_for_first_batch`` then keeps the RNG states of that moment and
    ``before_first_batch`` puts them back once more, since Lightning's resume bookkeeping may draw in between.
    """

    def __init__(self) -> None:
        self.held: dict[str, Any] = {}
        self.rng_for_first_batch: dict[str, Any] | None = None

    def hold(self, loss_target: dict[str, Any], rng: dict[str, Any]) -> None:
        """Keep a checkpoint's L₀ running mean (``LossTarget.state_dict()``) and RNG states until ``start``."""
        self.held = {"loss_target": loss_target, "rng": rng}

    def start(self, loss_target: Any, device: torch.device) -> bool:
        """Put the held state back into ``loss_target`` and the generators; False when there is none (no resume)."""
        held, self.held = self.held, {}
        if held:
            loss_target.load_state_dict(held["loss_target"], device)
            restore_rng_state(held["rng"])
        return bool(held)

    def hold_rng_for_first_batch(self) -> None:
        """Keep the generators' states as they are now, for ``before_first_batch``."""
        self.rng_for_first_batch = capture_rng_state()

    def before_first_batch(self, trainer: pl.Trainer) -> None:
        """The first batch after a resume draws the random numbers the interrupted run would have drawn, and counts
        the epoch start Lightning may have skipped (``repair_skipped_epoch_start``)."""
        if self.rng_for_first_batch is not None:
            restore_rng_state(self.rng_for_first_batch)
            self.rng_for_first_batch = None
            repair_skipped_epoch_start(trainer)
