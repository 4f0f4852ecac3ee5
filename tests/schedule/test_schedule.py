"""The CoMERA schedule objects on their own: no Trainer, no Lightning."""

import pytest
import torch

from comera_lightning import tensorize
from comera_lightning.rank import active_size, tt_layers
from comera_lightning.schedule import ComeraObjective, LossTarget, StageSchedule
from tests.helpers.plain_modules import PlainClassifier


def tt_model_layers():
    torch.manual_seed(0)
    model = PlainClassifier()
    tensorize(model, max_rank=8)
    return [m for _, m in tt_layers(model)]


def test_objective_formulas_per_stage_paper_late_stage():
    layers = tt_model_layers()
    objective = ComeraObjective(rank_weight=0.25, loss_weight=0.1, size_weight=0.01, late="paper")
    objective.bind(layers)
    loss = torch.tensor(2.0)
    gates = torch.cat([g for layer in layers for g in layer.gates])
    r = gates.sum() / gates.numel()
    torch.testing.assert_close(objective(loss, "early"), loss + 0.25 * r)
    objective.loss_target = 1.0
    size = float(active_size(layers))
    objective.size_target = 0.5 * size  # (L-L0)/L = 0.5 vs (S-S0)/S = 0.5: not <, so λ = 0 → focus on the loss
    torch.testing.assert_close(objective(loss, "late"), 0.1 * loss + 0.01 * r + loss)
    assert float(objective.last["lam"]) == 0.0
    objective.size_target = 0.1 * size  # 0.5 < 0.9: λ = 1 → focus on the size
    torch.testing.assert_close(objective(loss, "late"), 0.1 * loss + 0.01 * r + r)
    torch.testing.assert_close(objective(loss, "final"), loss)


def test_objective_surrogate_denominator_is_fixed_at_the_first_bind():
    layers = tt_model_layers()
    objective = ComeraObjective()
    objective.bind(layers)
    first = objective.normalizer
    with torch.no_grad():
        layers[0].gates[0][:3] = 0.0
    layers[0].prune_()
    objective.bind(layers)
    assert objective.normalizer == first, "pruning must not make R jump"


def test_objective_enter_late_fixes_size_targets_and_round_trips():
    layers = tt_model_layers()
    objective = ComeraObjective(target_ratio=0.3)
    objective.bind(layers)
    objective.enter_late(0.7)
    assert objective.size_at_switch == float(active_size(layers))
    assert objective.size_target == pytest.approx(0.3 * objective.size_at_switch) and objective.loss_target == 0.7
    restored = ComeraObjective(target_ratio=0.3)
    restored.load_state_dict(objective.state_dict())
    assert restored.state_dict() == objective.state_dict()
    with pytest.raises(KeyError, match="unknown keys"):
        restored.load_state_dict({"size_taget": 1.0})


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(target_ratio=0.0), "target_ratio"), (dict(rank_weight=-1), "rank_weight"), (dict(surrogate="l2"), "size_surrogate")],
)
def test_objective_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ComeraObjective(**kwargs)


def test_loss_target_precedence():
    metrics = {"val/loss": torch.tensor(9.0), "my/loss": torch.tensor(4.0)}
    train = LossTarget(metric="train")
    train.observe(torch.tensor(1.0))
    train.observe(torch.tensor(2.0))
    assert train.resolve(metrics) == 1.5, "'train' takes the epoch's mean training loss even with a validation loss"
    assert LossTarget(value=0.5).resolve(metrics) == 0.5
    assert LossTarget(metric="my/loss").resolve(metrics) == 4.0
    assert LossTarget().resolve(metrics) == 9.0
    fallback = LossTarget()
    fallback.observe(torch.tensor(3.0))
    assert fallback.resolve({}) == 3.0, "no validation loss: the epoch's mean training loss"
    with pytest.raises(ValueError, match="was not logged"):
        LossTarget(metric="val/los").resolve(metrics)
    with pytest.raises(ValueError, match="could not pick a loss target"):
        LossTarget().resolve({})


def test_loss_target_epoch_reset_is_in_place():
    target = LossTarget()
    target.reset_epoch(torch.device("cpu"))
    held = target._sum
    target.observe(torch.tensor(2.0))
    target.reset_epoch(torch.device("cpu"))
    assert target._sum is held and float(held) == 0.0, "a captured CUDA graph keeps adding into the same tensor"


def run_epochs(schedule, epochs):
    events = []
    for done in range(1, epochs + 1):
        event = schedule.after_epoch(done)
        events.append(event)
        if event == "switch":
            schedule.enter_late(done, done * 10)
        elif event == "finish":
            schedule.enter_final()
        if event:
            schedule.record_prune(done * 10)
    return events


def test_epoch_schedule_switches_prunes_and_finishes():
    schedule = StageSchedule(early_epochs=2, late_epochs=3, prune_every_n_epochs=1)
    assert run_epochs(schedule, 6) == [None, "switch", "prune", "prune", "finish", None]
    assert schedule.stage == "final" and schedule.prune_events == 4


def test_step_schedule_switches_prunes_and_finishes():
    schedule = StageSchedule(early_steps=4, late_steps=6, prune_every_n_steps=3)
    events = {}
    for step in range(1, 13):
        event = schedule.after_batch(step)
        if event == "switch":
            schedule.enter_late(0, step)
        elif event == "finish":
            schedule.enter_final()
        if event:
            schedule.record_prune(step)
            events[step] = event
    assert events == {4: "switch", 7: "prune", 10: "finish"}
    assert schedule.after_epoch(1) is None, "a step-based schedule ignores epoch ends"


def test_default_early_stage_is_resolved_without_touching_the_argument():
    schedule = StageSchedule()
    infos, warnings_ = schedule.resolve(max_epochs=30)
    assert infos and not warnings_ and schedule.early_epochs_resolved == 20
    assert schedule.early_epochs is None, "constructor arguments are never mutated"
    with pytest.raises(ValueError, match="needs early_epochs or early_steps"):
        StageSchedule().resolve(max_epochs=None)
    assert any("no late (compression) stage" in m for m in StageSchedule(early_epochs=4).resolve(max_epochs=4)[1]), "a warning"


def test_training_that_ends_in_the_early_stage_ends_with_one_prune_not_a_switch():
    schedule = StageSchedule(early_epochs=2)
    schedule.resolve(max_epochs=2)
    assert [schedule.after_epoch(epoch) for epoch in (1, 2)] == [None, "end"]
    default = StageSchedule()
    default.resolve(max_epochs=1)  # two thirds of one epoch: the early stage is the whole run
    assert default.after_epoch(1) == "end"
    longer = StageSchedule(early_epochs=2)
    longer.resolve(max_epochs=3)
    assert [longer.after_epoch(epoch) for epoch in (1, 2)] == [None, "switch"]


def test_schedule_state_round_trip_and_strict_load():
    schedule = StageSchedule(early_epochs=1)
    run_epochs(schedule, 2)
    fresh = StageSchedule(early_epochs=1)
    fresh.load_state_dict(schedule.state_dict())
    assert fresh.state_dict() == schedule.state_dict() and fresh.stage == "late"
    with pytest.raises(KeyError, match="unknown keys"):
        fresh.load_state_dict({"stgae": "late"})
    with pytest.raises(ValueError, match="stage='middle'"):
        fresh.load_state_dict({"stage": "middle"})


@pytest.mark.parametrize("kwargs", [dict(early_epochs=1, early_steps=2), dict(late_epochs=-1), dict(prune_every_n_steps=0)])
def test_schedule_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        StageSchedule(**kwargs)


def test_an_early_stage_length_given_now_wins_over_the_checkpoint_with_a_warning():
    saved = StageSchedule()
    saved.resolve(max_epochs=4)  # early_epochs_resolved = 3
    now = StageSchedule(early_epochs=2)
    with pytest.warns(UserWarning, match=r"early_epochs=2 given now differs from the checkpoint's 3"):
        now.load_state_dict(saved.state_dict())
    assert now.early_epochs_resolved == 2 and now.early_epochs == 2


def test_the_trained_model_schedule_takes_shares_of_the_run_and_stays_a_default():
    schedule = StageSchedule()
    message = schedule.resolve_trained(100, 0.1, 0.4, max_epochs=2)
    assert (schedule.early_steps_resolved, schedule.late_steps, schedule.max_epochs) == (10, 40, 2)
    assert "early stage = 10 of 100 steps, then a late stage of 40 (the cuts in its first half), then 50 steps" in message
    assert not schedule.lengths_given, "a second fit resolves it again from its own length"
    assert StageSchedule(late_steps=5).lengths_given
