"""Compressing a trained model: TensorizeConfig(init="svd") + a budget take the trained-model schedule (issue #52)."""

import lightning as L

from comera_lightning import ComeraCallback, TensorizeConfig
from comera_lightning.rank import tt_layers
from comera_lightning.schedule import BudgetConfig
from tests.helpers.callback_runs import trainer
from tests.helpers.plain_modules import PlainClassifier, loaders


def trained_classifier(tmp_path):
    L.seed_everything(0)
    model = PlainClassifier()
    trainer(tmp_path, [], max_epochs=4).fit(model, *loaders())
    return model


def test_a_trained_model_is_cut_early_then_fine_tuned_at_the_size_asked(tmp_path, caplog):
    model = trained_classifier(tmp_path)
    cb = ComeraCallback(tensorize=TensorizeConfig(init="svd"), budget=BudgetConfig(compression=8.0))
    run = trainer(tmp_path, [cb], max_epochs=5)  # 80 steps: early 8, a late stage of 32 (the cuts in its first 16)
    run.fit(model, *loaders())
    assert "from trained weights (init='svd'): early stage = 8 of 80 steps" in caplog.text
    assert cb.schedule.late_start_step == 8 and cb.stage == "final"
    assert cb.schedule.last_prune_step <= 8 + 32 <= run.global_step
    size = sum(core.numel() for _, layer in tt_layers(model) for core in layer.cores)
    assert abs(size / cb.size_target - 1) <= 0.1


def test_stage_lengths_given_win_over_the_trained_schedule(tmp_path, caplog):
    model = trained_classifier(tmp_path)
    cb = ComeraCallback(tensorize=TensorizeConfig(init="svd"), budget=BudgetConfig(compression=8.0, early_epochs=2))
    trainer(tmp_path, [cb], max_epochs=4).fit(model, *loaders())
    assert "from trained weights" not in caplog.text and cb.schedule.late_start_step == 32
