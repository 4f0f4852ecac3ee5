"""The guarded late stage: L + λR, λ on while the running loss and the validation loss hold (no Trainer)."""

import pytest
import torch

from comera_lightning.rank import active_size, size_surrogate
from comera_lightning.schedule import ComeraObjective, QualityGuard
from tests.schedule.test_schedule import tt_model_layers


def guarded_objective(tolerance=0.02):
    layers = tt_model_layers()
    objective = ComeraObjective(target_ratio=0.5, loss_tolerance=tolerance)
    objective.bind(layers)
    objective.enter_late(2.0, validation_loss=2.0)
    gates = torch.cat([g for layer in layers for g in layer.gates])
    return objective, layers, gates.sum() / gates.numel()


def test_guarded_late_stage_keeps_the_full_task_loss_and_adds_the_size_term_while_the_loss_holds():
    objective, layers, r = guarded_objective()
    loss = torch.tensor(2.0)
    spared = size_surrogate(layers, "mean", objective.normalizer, spare_strongest=True)
    assert spared < r, "each bond's strongest gate is left out of the size term"
    torch.testing.assert_close(objective(loss, "late"), loss + spared)  # first step: the loss is its own best
    assert float(objective.last["lam"]) == 1.0
    for _ in range(200):  # the running mean climbs 10 % above its best: λ = 0, the task loss alone
        objective(torch.tensor(2.2), "late")
    torch.testing.assert_close(objective(torch.tensor(2.2), "late"), torch.tensor(2.2))
    assert float(objective.last["lam"]) == 0.0


def test_guarded_size_term_stops_at_the_size_target():
    objective, layers, _ = guarded_objective()
    objective.size_target = float(active_size(layers)) + 1  # already below S₀
    torch.testing.assert_close(objective(torch.tensor(2.0), "late"), torch.tensor(2.0))


def test_a_validation_worse_than_the_best_pauses_shrinking_until_it_recovers():
    guard = QualityGuard(tolerance=0.02)
    guard.start(2.0)
    assert guard.pressure(torch.tensor(2.0)) == 1.0
    assert guard.after_validation(1.9) is None and guard.best_validation == 1.9
    assert "paused" in guard.after_validation(1.95)  # 2.6 % worse than 1.9
    assert guard.pressure(torch.tensor(1.0)) == 0.0
    assert "resumes" in guard.after_validation(1.91)
    assert guard.pressure(torch.tensor(1.0)) == 1.0


def test_without_a_validation_before_the_switch_the_first_one_after_it_is_the_reference():
    """A run that validates only later (a step-based switch early in a compress run) is not judged against its
    training loss: a validation loss above it is the reference, not a reason to pause."""
    guard = QualityGuard(tolerance=0.02)
    assert guard.after_validation(9.0) is None and guard.best_validation is None  # before the switch: not watching
    guard.start(None)
    assert guard.after_validation(3.55) is None and not guard.paused and guard.best_validation == 3.55
    assert "paused" in guard.after_validation(3.7)
    restored = QualityGuard()
    restored.load_state_dict(guard.state_dict())
    assert restored.started and restored.paused


def test_guard_state_round_trips_through_the_objective():
    objective, _, _ = guarded_objective()
    objective(torch.tensor(2.0), "late")
    objective.guard.after_validation(2.5)
    state = objective.state_dict()
    restored = ComeraObjective(target_ratio=0.5)
    restored.load_state_dict(state)
    assert restored.guard.paused and restored.guard.best_validation == 2.0
    torch.testing.assert_close(restored.guard.state_dict()["loss_average"], state["guard"]["loss_average"])
    assert float(restored.guard.pressure(torch.tensor(2.0))) == 0.0  # paused survives the resume


def test_unknown_late_objective_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="guarded"):
        ComeraObjective(late="papr")
