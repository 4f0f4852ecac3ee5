"""The size budget (BudgetConfig): the size asked is the size reached, where the ranks go is decided by training."""

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from comera_lightning import ComeraCallback
from comera_lightning.rank import compression_stats, tt_layers
from comera_lightning.schedule import BudgetConfig
from tests.helpers.callback_runs import trainer
from tests.helpers.plain_modules import PlainClassifier, loaders


def tt_size(model):
    return sum(core.numel() for _, layer in tt_layers(model) for core in layer.cores)


def fit(tmp_path, budget, epochs=6, **kwargs):
    L.seed_everything(0)
    model, cb = PlainClassifier(), ComeraCallback(budget=budget, early_epochs=2, **kwargs)
    logger = CSVLogger(tmp_path, name="run")
    trainer(tmp_path, [cb], logger=logger, max_epochs=epochs).fit(model, *loaders())
    return model, cb, logger


@pytest.mark.parametrize("budget", [BudgetConfig(), BudgetConfig(compression=12.0), BudgetConfig(target_ratio=0.25)])
def test_the_run_ends_at_the_size_asked(tmp_path, budget):
    model, cb, logger = fit(tmp_path, budget)
    asked = cb.size_target
    assert asked is not None and abs(tt_size(model) / asked - 1) <= 0.1
    if budget.asked_compression is not None:  # BudgetConfig(): the default, 4x
        stats = compression_stats(model)
        assert abs(stats.dense_tt_parameters / stats.tt_parameters / budget.asked_compression - 1) <= 0.1
    rows = list(csv.DictReader(open(Path(logger.log_dir) / "comera_ranks.csv")))
    assert [r["layer"] for r in rows] == ["encoder.0", "encoder.2"]
    assert [r["ranks"] for r in rows] == [" ".join(map(str, layer.ranks)) for _, layer in tt_layers(model)]


def test_a_compression_budget_starts_at_twice_the_size_asked_and_a_fixed_one_at_it(tmp_path):
    sizes = {}
    for adapt in (True, False):
        model, cb, _ = fit(tmp_path / str(adapt), BudgetConfig(compression=12.0, adapt=adapt), epochs=2)  # no late stage
        stats = compression_stats(model)
        sizes[adapt] = stats.tt_parameters / (stats.dense_tt_parameters / 12.0)
    assert 1.6 < sizes[True] < 2.4 and 0.8 < sizes[False] < 1.25


def test_a_budget_near_min_compression_starts_where_every_layer_still_gains(tmp_path):
    model, cb, _ = fit(tmp_path, BudgetConfig(compression=2.0))  # twice the size asked would be dense
    stats = compression_stats(model)
    assert len(tt_layers(model)) == len(cb.tensorize_config.target_modules)
    assert abs(stats.dense_tt_parameters / stats.tt_parameters / 2.0 - 1) < 0.1


def test_the_least_important_ranks_go_and_no_bond_dies(tmp_path):
    model, cb, _ = fit(tmp_path, BudgetConfig(compression=200.0))
    assert all(rank >= 1 for _, layer in tt_layers(model) for rank in layer.ranks)
    saved = cb.gate_optimizer.state_dict()["state"]  # the gates' Adam state after the fit: importance sliced with the gates
    assert [tuple(saved[i]["importance"].shape) for i in range(2)] == [layer.gates[0].shape for _, layer in tt_layers(model)]


def test_only_the_svd_cut_aligns_bonds_and_its_moments_follow(tmp_path, monkeypatch):
    from comera_lightning.layers import TTModule

    calls = []
    align = TTModule.align_bond_
    monkeypatch.setattr(TTModule, "align_bond_", lambda layer, bond: calls.append(bond) or align(layer, bond))
    fit(tmp_path / "gates", BudgetConfig(compression=12.0))
    assert calls == []
    model, cb, _ = fit(tmp_path / "svd", BudgetConfig(compression=12.0, cut="svd"))
    assert calls and abs(tt_size(model) / cb.size_target - 1) <= 0.1


def test_allow_rank0_lets_a_layer_go(tmp_path):
    model, _, _ = fit(tmp_path, BudgetConfig(compression=1000.0, allow_rank0=True))
    assert any(0 in layer.physical_ranks for _, layer in tt_layers(model))


def test_a_parameter_budget_counts_the_whole_model(tmp_path):
    model, _, _ = fit(tmp_path, BudgetConfig(parameters=2_400))
    assert abs(sum(p.numel() for p in model.parameters()) / 2_400 - 1) <= 0.1


def test_a_budget_the_model_cannot_meet_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match="outside its tensorized layers' cores"):
        fit(tmp_path, BudgetConfig(parameters=100))


def test_the_guard_holds_the_budget_and_the_run_says_so(tmp_path, caplog):
    # L₀ = 0 is the best loss at the switch: every validation is worse by more than the tolerance and pauses the shrinking
    model, cb, _ = fit(tmp_path, BudgetConfig(compression=12.0), loss_target=0.0)
    assert tt_size(model) > 1.1 * cb.size_target
    assert "the quality guard held the shrinking" in caplog.text


def test_a_trainer_counting_steps_only_gets_the_default_stages(tmp_path):
    L.seed_everything(0)
    model, cb = PlainClassifier(), ComeraCallback(budget=BudgetConfig(compression=12.0))
    trainer(tmp_path, [cb], max_epochs=-1, max_steps=60).fit(model, *loaders())
    assert cb.schedule.early_steps_resolved == 40 and cb.stage == "late"
    assert abs(tt_size(model) / cb.size_target - 1) <= 0.1


def test_budget_options_and_direct_arguments_meet_in_one_config():
    cb = ComeraCallback(budget={"compression": 8.0, "early_epochs": 3}, early_epochs=5, loss_tolerance=0.05)
    assert cb.budget_config == BudgetConfig(compression=8.0, early_epochs=5, loss_tolerance=0.05)
    # a length in the other unit replaces the config's (a CLI override of a bundled config's epochs)
    cb = ComeraCallback(budget={"early_epochs": 3, "late_epochs": 2}, early_steps=2, late_steps=2)
    assert (cb.budget_config.early_epochs, cb.budget_config.early_steps, cb.budget_config.late_epochs) == (None, 2, None)
    with pytest.raises(ValueError, match="early_epochs=1 and early_steps=2 conflict"):
        ComeraCallback(early_epochs=1, early_steps=2)
    with pytest.raises(ValueError, match="compression=8.0 and parameters=10"):
        BudgetConfig(compression=8.0, parameters=10)
    with pytest.raises(TypeError, match="unknown budget option"):
        BudgetConfig().replace(compresion=2.0)
    with pytest.raises(ValueError, match=r"cut='SVD' is unknown; choose one of \('gates', 'svd'\)"):
        BudgetConfig(cut="SVD")


def test_a_budget_run_resumes_with_its_importance(tmp_path):
    model, cb, _ = fit(tmp_path, BudgetConfig(compression=12.0), epochs=3)
    state = cb.state_dict()
    saved = state["gates"]["state"]
    assert saved and all("importance" in entry for entry in saved.values())
    again = ComeraCallback(budget=BudgetConfig(compression=12.0), early_epochs=2)
    again.load_state_dict(state)
    assert again.schedule.last_late_prune_step == cb.schedule.last_late_prune_step


def test_an_adaptive_start_lowers_only_the_cap_of_the_kind_of_layer_that_would_stay_dense():
    import transformers
    from comera_lightning import TensorizeConfig
    from comera_lightning.tensorize import planned_sizes

    config = transformers.LlamaConfig(vocab_size=261, hidden_size=48, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config)  # a byte-level LM: its 48x261 head gains little from TT
    names, dense, _ = planned_sizes(model, TensorizeConfig())
    caps = BudgetConfig(compression=2.0).start_caps(model, TensorizeConfig())
    kept, _, start = planned_sizes(model, caps)
    assert kept == names, "every layer the default caps tensorize is still tensorized at the start"
    assert 1.5 <= dense / start < 1.9, "as near twice the size asked (1x) as min_compression allows"


def test_from_trained_weights_the_start_may_be_as_large_as_the_dense_layers():
    """init="svd": the cuts begin from (about) the trained model, not from a start that lost min_compression already;
    the layers tensorized are still those the user's min_compression takes."""
    import transformers
    from comera_lightning import TensorizeConfig
    from comera_lightning.tensorize import planned_sizes

    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config)
    trained = TensorizeConfig(init="svd")
    names, dense, _ = planned_sizes(model, trained)
    caps = BudgetConfig(compression=2.0).start_caps(model, trained)
    kept, _, start = planned_sizes(model, caps)
    assert kept == names and caps.min_compression == 1.0
    assert 1.0 <= dense / start < 1.25, "at about the dense size: twice the size asked"
    assert dense / planned_sizes(model, BudgetConfig(compression=2.0).start_caps(model, TensorizeConfig()))[2] >= 1.5, \
        "from scratch each layer still starts min_compression smaller"
    assert 3.6 < dense / planned_sizes(model, BudgetConfig(compression=8.0).start_caps(model, trained))[2] < 4.4, \
        "a start below the dense size stays twice the size asked"


def test_the_report_still_says_why_layers_stay_dense_when_the_budget_pins_the_layers(tmp_path, caplog):
    """The budget's start caps name the layers to tensorize; the report keeps the default rules' reasons for the rest."""
    caplog.set_level("INFO")
    model, cb, _ = fit(tmp_path, BudgetConfig(), epochs=1)
    assert cb.tensorize_config.target_modules == ["encoder.0", "encoder.2"]
    assert "1 skipped" in caplog.text and "- head" in caplog.text and "a classifier stays dense" in caplog.text


def test_planning_draws_no_random_numbers():
    """A seeded run tensorizes the same cores whatever a budget plans first (its start caps, the report's skipped layers)."""
    from comera_lightning import TensorizeConfig
    from comera_lightning.tensorize import skipped_layers

    torch.manual_seed(0)
    model = PlainClassifier()
    skipped_layers(model, TensorizeConfig())
    BudgetConfig(compression=8.0).start_caps(model, TensorizeConfig())
    after = torch.rand(1)
    torch.manual_seed(0)
    PlainClassifier()
    assert torch.equal(after, torch.rand(1))


@pytest.mark.parametrize("adapt", [True, False])
def test_a_budget_the_caps_cannot_start_at_keeps_every_layer_and_says_so(adapt):
    """A small Transformer whose token table is capped at its width: the tensorized layers cannot be only 2x smaller."""
    from comera_lightning import TensorizeConfig
    from comera_lightning.models.transformer import SentencePairClassifier
    from comera_lightning.tensorize import planned_sizes

    model = SentencePairClassifier(vocab_size=8192, num_classes=3, d_model=64, num_layers=2, num_heads=4, d_ff=256,
                                   max_positions=64)
    names, dense, _ = planned_sizes(model, TensorizeConfig())
    with pytest.warns(UserWarning, match=r"BudgetConfig\(compression=2\): the tensorized layers start at .* already below"):
        caps = BudgetConfig(compression=2.0, adapt=adapt).start_caps(model, TensorizeConfig())
    kept, _, start = planned_sizes(model, caps)
    assert kept == names, "fixed ranks too keep every layer the default caps tensorize"
    assert dense / start > 2.0


def test_the_objective_keeps_the_size_asked_when_the_layers_start_below_it():
    from comera_lightning import tensorize
    from comera_lightning.schedule import ComeraObjective

    model = PlainClassifier()
    tensorize(model, max_rank=4)
    objective = ComeraObjective(1.0, 0.0, late="budget", end_size=lambda size: 2 * size)
    objective.bind([layer for _, layer in tt_layers(model)])
    objective.enter_late(1.0)
    assert objective.size_target == objective.size_at_switch and objective.size_asked == 2 * objective.size_at_switch


def test_a_cut_that_raises_the_training_loss_holds_the_next_one_with_one_validation_an_epoch(tmp_path, caplog):
    # 16 steps an epoch, one validation each, a prune every 2 steps: only the training loss sees the cuts between them
    budget = BudgetConfig(compression=30.0, prune_every_n_steps=2, loss_tolerance=0.0)
    model, cb, _ = fit(tmp_path, budget, epochs=4)
    held = [step for step in cb.events.held_at if f"cut held at step {step}: the training loss" in caplog.text]
    assert any(step % 16 for step in held), "held between validations, by the training loss"
    assert abs(tt_size(model) / cb.size_target - 1) <= 0.1, "a later prune cuts to what the schedule asks by then"
    model, cb, _ = fit(tmp_path, budget.replace(loss_tolerance=100.0), epochs=4)
    assert cb.events.held_at == [] and abs(tt_size(model) / cb.size_target - 1) <= 0.1
