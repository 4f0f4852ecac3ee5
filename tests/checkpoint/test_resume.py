"""Resume from a checkpoint taken at any step equals the uninterrupted run (issue: long runs survive faults).

The module has dropout and a shuffled (resumable) training loader, so the RNG and the data order
must be restored too. 16 batches an epoch; checkpoints every 8 steps (written in on_train_batch_end).
"""

import warnings

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.helpers.callback_runs import assert_same, callback, trainer
from tests.helpers.plain_modules import PlainClassifier, loaders

EPOCH_BASED = dict(early_epochs=2, late_epochs=2)
STEP_BASED = dict(early_epochs=None, early_steps=24, late_steps=32, prune_every_n_steps=8)


class BatchLog(L.Callback):
    """The first input value of every training batch, by global step (the data order)."""

    def __init__(self):
        self.first_values = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.first_values[trainer.global_step] = float(batch[0][0, 0])


def _run(tmp_path, schedule, ckpt_path=None, save=False, max_epochs=5):
    L.seed_everything(0)
    model, cb, batches = PlainClassifier(dropout=0.2), callback(**schedule), BatchLog()
    callbacks = [cb, batches]
    if save:
        callbacks.append(ModelCheckpoint(dirpath=tmp_path / "every8", every_n_train_steps=8, save_top_k=-1))
    t = trainer(tmp_path, callbacks, max_epochs=max_epochs, deterministic=True)
    t.fit(model, *loaders(shuffle=True), ckpt_path=ckpt_path)
    return model, cb, batches.first_values, t


@pytest.fixture(scope="module", params=["epoch-based", "step-based"])
def straight(request, tmp_path_factory):
    schedule = EPOCH_BASED if request.param == "epoch-based" else STEP_BASED
    tmp_path = tmp_path_factory.mktemp(request.param)
    return schedule, tmp_path, _run(tmp_path, schedule, save=True)


@pytest.mark.parametrize("step", [24, 32, 40, 48])
def test_resume_at_any_step_equals_the_uninterrupted_run(straight, step):
    """24: mid-epoch (the step-based switch); 32: last batch of the early stage (epoch-based switch);
    40: late stage mid-epoch (a step-based prune); 48: last batch of a late-stage epoch (an epoch-based prune)."""
    schedule, tmp_path, (model, cb, order, _) = straight
    ckpt = next((tmp_path / "every8").glob(f"*-step={step}.ckpt"))
    resumed, cb_resumed, resumed_order, _ = _run(tmp_path / f"from{step}", schedule, ckpt_path=ckpt)
    assert resumed_order == {s: v for s, v in order.items() if s >= step}, "data order after the resume"
    assert cb_resumed.schedule.late_start_step == cb.schedule.late_start_step, "the switch step"
    assert cb_resumed.prune_events == cb.prune_events and cb_resumed.loss_target_value == cb.loss_target_value
    assert_same(cb_resumed.schedule.state_dict(), cb.schedule.state_dict())
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)


def test_a_second_resume_after_one_at_an_epochs_last_batch_equals_the_uninterrupted_run(straight):
    """Resumed at step 48 (an epoch's last batch), Lightning skips the next epoch's start; the run's own checkpoint at
    step 56 must still read as mid-epoch, so that resuming from it does not replay the epoch."""
    schedule, tmp_path, (model, cb, order, _) = straight
    first = next((tmp_path / "every8").glob("*-step=48.ckpt"))
    _, _, _, resumed = _run(tmp_path / "from48", schedule, ckpt_path=first, save=True)
    progress = resumed.fit_loop.epoch_progress.total
    assert progress.started == progress.completed + 1 or progress.completed == resumed.max_epochs
    second = next((tmp_path / "from48" / "every8").glob("*-step=56.ckpt"))
    again, cb_again, again_order, _ = _run(tmp_path / "from56", schedule, ckpt_path=second)
    assert again_order == {s: v for s, v in order.items() if s >= 56}, "data order after the second resume"
    assert cb_again.prune_events == cb.prune_events
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)


def test_a_missed_epoch_end_replays_its_validation(tmp_path):
    """Lightning skips the validation of an epoch whose last batch wrote the checkpoint; the callback runs it."""
    _, _, _, t = _run(tmp_path, EPOCH_BASED, save=True, max_epochs=2)
    val_loss = float(t.callback_metrics["val/loss"])
    ckpt = tmp_path / "every8" / "epoch=1-step=32.ckpt"
    _, cb, _, resumed = _run(tmp_path / "resumed", EPOCH_BASED, ckpt_path=ckpt, max_epochs=3)
    assert cb.stage == "late" and cb.loss_target_value == pytest.approx(val_loss, abs=0), "L₀ from the replayed validation"


def test_settings_given_now_win_over_the_checkpoints_with_one_warning(tmp_path):
    def fit(ckpt_path=None, **changes):
        L.seed_everything(0)
        cb = callback(**{**EPOCH_BASED, **changes})
        saver = ModelCheckpoint(dirpath=tmp_path / "c", save_last=True)
        trainer(tmp_path, [cb, saver], max_epochs=3).fit(PlainClassifier(), *loaders(), ckpt_path=ckpt_path)
        return cb

    first = fit()
    with warnings.catch_warnings(record=True) as unchanged:
        warnings.simplefilter("always")
        fit(ckpt_path=tmp_path / "c" / "last.ckpt")
    assert not [w for w in unchanged if "differ from the checkpoint's" in str(w.message)], "same settings: no warning"
    with pytest.warns(UserWarning, match=r"target_ratio: checkpoint 0.3, now 0.5; gate_lr: checkpoint 0.03, now 0.1") as record:
        resumed = fit(ckpt_path=tmp_path / "c" / "last.ckpt", target_ratio=0.5, gate_lr=0.1)
    assert sum("differ from the checkpoint's" in str(w.message) for w in record) == 1
    assert resumed.stage_objective.target_ratio == 0.5 and resumed.gate_optimizer.lr == 0.1
    assert resumed.loss_target_value == first.loss_target_value, "progress (L₀) comes from the checkpoint"
