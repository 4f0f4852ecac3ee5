"""The budget's late stage watches the training loss between cuts (no Trainer; the Trainer run: tests/callback/test_budget.py)."""

import pytest
import torch

from comera_lightning.schedule import ComeraObjective
from comera_lightning.schedule.cut_watch import CutWatch
from tests.schedule.test_schedule import tt_model_layers


def watched(watch, losses):
    for loss in losses:
        watch.observe(torch.tensor(loss))
    return watch.window()


def test_a_window_above_the_level_by_more_than_the_tolerance_and_its_noise_holds_the_cut():
    watch = CutWatch(tolerance=0.02)
    stats = watched(watch, [2.0, 2.2] * 20)
    assert stats.mean == pytest.approx(2.1) and stats.level == pytest.approx(2.1, abs=0.01)
    assert watch.allows(stats) and watch.best == pytest.approx(stats.level)
    assert watch.window() is None, "a decision empties the window"
    assert not watch.allows(watched(watch, [2.3, 2.31, 2.29])), "~10 % above the level, well beyond the window's noise"
    assert watch.allows(watched(watch, [2.15, 2.13, 2.14])), "within 2 % and its noise: the cut goes ahead"
    assert watch.allows(watched(watch, [1.5, 3.3])), "a rise inside two noisy batches' error is not a verdict"
    assert watch.allows(watched(watch, [9.0])), "one step is no window: nothing to judge"


def test_a_few_easy_batches_do_not_set_the_bar():
    watch = CutWatch(tolerance=0.02)
    watched(watch, [3.2] * 50)
    assert watch.allows(watched(watch, [2.5, 2.6, 2.55]))  # an easy window: the reference stays the level, ~3.2
    assert watch.best > 3.0
    assert watch.allows(watched(watch, [3.2, 3.21, 3.19]))


def test_the_budget_objective_watches_the_loss_and_its_state_survives_a_resume():
    objective = ComeraObjective(late="budget")
    objective.bind(tt_model_layers())
    objective(torch.tensor(3.0), "early")  # the early stage feeds the level the first late prune compares with
    objective.enter_late(2.0)
    for loss in (2.0, 2.4):
        torch.testing.assert_close(objective(torch.tensor(loss), "late"), torch.tensor(loss))  # the task loss alone
    assert objective.watch.window().mean == pytest.approx(2.2), "the switch starts a fresh window"
    objective(torch.tensor(5.0), "final")
    assert objective.watch.window().mean == pytest.approx(2.2), "after the late stage nothing is watched"
    restored = ComeraObjective(late="budget")
    restored.load_state_dict(objective.state_dict())
    assert restored.watch.window() == objective.watch.window()
    old = objective.state_dict()
    del old["watch"]  # a checkpoint from before the watch
    restored.load_state_dict(old)
