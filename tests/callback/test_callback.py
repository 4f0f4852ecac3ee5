import csv
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from comera_lightning import BudgetConfig, ComeraCallback, TTLinear
from comera_lightning.rank import tt_layers
from tests.helpers.callback_runs import assert_same, callback, trainer
from tests.helpers.paths import ROOT, SCRIPTS
from tests.helpers.plain_modules import LateBuiltClassifier, PlainClassifier, loaders


def physical_size(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "came"])
def test_plain_module_is_tensorized_and_pruned_physically(tmp_path, optimizer):
    L.seed_everything(0)
    # CAME with the cores' steps scaled 4x: no gate of this 6-epoch toy reaches the threshold (the pruning is what is tested)
    model, cb = PlainClassifier(optimizer=optimizer), callback(**({"core_step_scale": 1.0} if optimizer == "came" else {}))
    dense = physical_size(model)
    logger = CSVLogger(tmp_path, name="run")
    trainer(tmp_path, [cb], logger=logger).fit(model, *loaders())
    assert isinstance(model.encoder[0], TTLinear) and isinstance(model.encoder[2], TTLinear)
    assert isinstance(model.head, torch.nn.Linear), "the output head stays dense"
    assert cb.stage == "late" and cb.prune_events >= 2
    full = TTLinear(64, 128, max_rank=8).physical_ranks
    assert sum(model.encoder[0].physical_ranks) < sum(full), "ranks must shrink physically"
    assert physical_size(model) < dense / 3
    rows = list(csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")))
    ratios = [float(r["comera/compression_model"]) for r in rows if r.get("comera/compression_model")]
    assert ratios and ratios[-1] > ratios[0], "compression curve must rise as ranks fall"
    assert any(r.get("comera/rank/encoder.0") for r in rows) and any(r.get("comera/lam") for r in rows)


def test_pruned_checkpoint_loads_into_fresh_models_with_identical_outputs(tmp_path):
    L.seed_everything(0)
    model, cb = PlainClassifier(), callback()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    t = trainer(tmp_path, [cb, ckpt])
    t.fit(model, *loaders())
    path = tmp_path / "ckpt" / "last.ckpt"
    x = torch.randn(8, 64)
    model.eval()
    expected = model(x)

    loaded = PlainClassifier.load_from_checkpoint(path)
    loaded.eval()
    assert loaded.encoder[0].physical_ranks == model.encoder[0].physical_ranks
    torch.testing.assert_close(loaded(x), expected)

    fresh = PlainClassifier()
    result = trainer(tmp_path, [callback()]).validate(fresh, loaders()[1], ckpt_path=path, verbose=False)
    assert result and fresh.encoder[0].physical_ranks == model.encoder[0].physical_ranks
    fresh.eval()
    torch.testing.assert_close(fresh(x), expected)


def test_decorated_class_loads_in_a_new_process(tmp_path):
    L.seed_everything(0)
    model = PlainClassifier()
    t = trainer(tmp_path, [callback(), ModelCheckpoint(dirpath=tmp_path, save_last=True)], max_epochs=3)
    t.fit(model, *loaders())
    model.eval()
    torch.save(model(torch.ones(2, 64)).detach(), tmp_path / "expected.pt")
    code = (
        "import torch, comera_lightning as c; from tests.helpers.plain_modules import PlainClassifier as M;"
        "c.tensorized_checkpoints(M); m = M.load_from_checkpoint(r'%s').eval();"
        "torch.testing.assert_close(m(torch.ones(2, 64)), torch.load(r'%s')); print('same')"
    ) % (tmp_path / "last.ckpt", tmp_path / "expected.pt")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "same" in out.stdout, out.stderr[-2000:]


def _run(tmp_path, max_epochs, ckpt_path=None, save=False, module=PlainClassifier):
    L.seed_everything(0)
    model, cb = module(), callback(early_epochs=2, late_epochs=2)
    callbacks = [cb] + ([ModelCheckpoint(dirpath=tmp_path / "resume", save_top_k=-1, every_n_epochs=1)] if save else [])
    trainer(tmp_path, callbacks, max_epochs=max_epochs, deterministic=True).fit(model, *loaders(), ckpt_path=ckpt_path)
    return model, cb


@pytest.mark.parametrize("resume_epoch", [1, 3])  # mid early stage, mid late stage
def test_resume_mid_stage_matches_uninterrupted_run(tmp_path, resume_epoch):
    straight, cb_straight = _run(tmp_path, max_epochs=5, save=True)
    ckpt = tmp_path / "resume" / f"epoch={resume_epoch - 1}-step={resume_epoch * 16}.ckpt"
    assert ckpt.exists(), sorted(os.listdir(tmp_path / "resume"))
    resumed, cb_resumed = _run(tmp_path, max_epochs=5, ckpt_path=ckpt)
    assert_same(cb_resumed.state_dict(), cb_straight.state_dict())
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_resume_of_a_module_built_in_configure_model_matches_uninterrupted_run(tmp_path):
    straight, cb_straight = _run(tmp_path, max_epochs=5, save=True, module=LateBuiltClassifier)
    assert isinstance(straight.encoder[0], TTLinear)
    ckpt = tmp_path / "resume" / "epoch=2-step=48.ckpt"  # in the late stage, after two prunes
    resumed, cb_resumed = _run(tmp_path, max_epochs=5, ckpt_path=ckpt, module=LateBuiltClassifier)
    assert_same(cb_resumed.state_dict(), cb_straight.state_dict())
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_composes_with_standard_callbacks_and_repeated_fit_validate_test(tmp_path):
    L.seed_everything(0)
    model, cb = PlainClassifier(), callback()
    callbacks = [
        cb, ModelCheckpoint(dirpath=tmp_path, monitor="val/loss"), EarlyStopping(monitor="val/loss", patience=5),
        LearningRateMonitor(logging_interval="step"),
    ]
    t = trainer(tmp_path, callbacks, logger=CSVLogger(tmp_path), max_epochs=3)
    t.fit(model, *loaders())
    layers = [id(m) for _, m in tt_layers(model)]
    t.validate(model, loaders()[1], verbose=False)
    t.test(model, loaders()[1], verbose=False)
    t.fit_loop.max_epochs = 4
    t.fit(model, *loaders())
    assert [id(m) for _, m in tt_layers(model)] == layers, "no double swap"
    assert "training_step" not in model.__dict__, "the module gets its own training_step back"


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_accumulation_clipping_and_mixed_precision(tmp_path, precision):
    L.seed_everything(0)
    model, cb = PlainClassifier(), callback()
    t = trainer(tmp_path, [cb], precision=precision, accumulate_grad_batches=2, gradient_clip_val=1.0, max_epochs=3)
    t.fit(model, *loaders())
    assert cb.stage == "late" and t.global_step == 3 * 8
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nan_loss_stops_with_the_step_and_keeps_checkpoints_clean(tmp_path):
    L.seed_everything(0)
    model = PlainClassifier(nan_at_step=5)
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_last=True)
    with pytest.raises(FloatingPointError, match="nan at global step 5"):
        trainer(tmp_path, [callback(), ckpt]).fit(model, *loaders())
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 5
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(early_epochs=2, early_steps=10), "early_epochs=2 and early_steps=10 conflict"),
        (dict(late_epochs=1, late_steps=5), "late_epochs=1 and late_steps=5 conflict"),
        (dict(prune_every_n_epochs=1, prune_every_n_steps=5), "conflict"),
        (dict(target_ratio=0.0), r"target_ratio must be a number in \(0.0, 1.0\], got 0.0"),
        (dict(target_ratio=1.5), "target_ratio"),
        (dict(rank_weight=-1), "rank_weight"),
        (dict(max_rank=0), "max_rank must be an integer >= 1"),
        (dict(early_epochs=-1), "early_epochs must be an integer >= 0"),
        (dict(size_surrogate="l0"), "size_surrogate='l0'"),
        (dict(tensorize={"init": "xavier"}), "init='xavier'"),
        (dict(tensorize={"layer_config": {"encoder.0": {"rnak": 2}}}), "unknown keys"),
    ],
)
def test_bad_arguments_fail_in_init(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ComeraCallback(**kwargs)


def test_no_matching_module_fails_at_setup_naming_the_rule(tmp_path):
    with pytest.raises(ValueError, match=r"target_modules entries \['attention'\] match no module"):
        trainer(tmp_path, [callback(target_modules=["attention"])]).fit(PlainClassifier(), *loaders())


def test_unsupported_strategy_and_manual_optimization_are_refused():
    from lightning.pytorch.strategies import FSDPStrategy

    fake = SimpleNamespace(strategy=FSDPStrategy(), max_epochs=2)
    with pytest.raises(ValueError, match="does not support FSDPStrategy: pruning changes parameter shapes.*docs/SCALING.md"):
        callback().setup(fake, PlainClassifier(), "fit")
    manual = PlainClassifier()
    manual.automatic_optimization = False
    with pytest.raises(ValueError, match="manual optimization.*allow_manual_optimization=True"):
        callback().setup(SimpleNamespace(strategy=object(), max_epochs=2), manual, "fit")


# dead-bonds, spawn: training goes on after rank 0. Each is 2 processes: dead-bonds in the default run, the others -m slow.
@pytest.mark.parametrize("mode", [pytest.param("default", marks=pytest.mark.slow), "dead-bonds",
                                  pytest.param("spawn", marks=pytest.mark.slow)])
def test_two_process_ddp_prunes_identically_on_every_rank(tmp_path, mode):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "ddp_prune_script.py"), str(tmp_path), mode],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0]["ranks"] == ranks[1]["ranks"] and ranks[0]["prunes"] >= 2
    assert ranks[0]["l0"] == ranks[1]["l0"], "one L0 on every rank"
    if mode != "default":
        assert any(0 in bonds for bonds in ranks[0]["ranks"].values())
    assert sum(sum(v) for v in ranks[0]["ranks"].values()) < ranks[0]["full"]
    for key in ranks[0]["state"]:
        torch.testing.assert_close(ranks[0]["state"][key], ranks[1]["state"][key])


def test_wandb_offline_run_gets_the_per_layer_rank_table(tmp_path, monkeypatch):
    import json

    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    L.seed_everything(0)
    logger = WandbLogger(project="comera-test", save_dir=str(tmp_path), offline=True)
    trainer(tmp_path, [callback(early_epochs=1)], logger=logger, max_epochs=2).fit(PlainClassifier(), *loaders())
    import wandb

    wandb.finish()
    tables = sorted(tmp_path.glob("wandb/offline-run-*/files/media/table/comera/ranks_*.table.json"))
    assert len(tables) == 2, "one rank table per epoch"
    table = json.loads(tables[-1].read_text())
    assert table["columns"] == ["layer", "ranks", "params", "dense_params", "compression"]
    assert [row[0] for row in table["data"]] == ["encoder.0", "encoder.2"]


def test_a_step_prune_interval_alone_replaces_the_default_epoch_interval():
    cb = ComeraCallback(prune_every_n_steps=20)
    assert cb.schedule.prune_every_n_steps == 20 and cb.schedule.prune_every_n_epochs is None
    assert ComeraCallback().schedule.prune_every_n_epochs == 1


def test_loss_target_train_is_the_mean_training_loss_even_with_a_validation_loss(tmp_path):
    L.seed_everything(0)
    model, cb = PlainClassifier(), callback(loss_target_metric="train", early_epochs=None, early_steps=5, late_steps=3)
    trainer(tmp_path, [cb], max_steps=8).fit(model, *loaders())  # a switch in mid-epoch (no epoch metric yet)
    assert cb.stage == "final" and 0 < cb.loss_target_value < 10


def test_a_step_switch_takes_l0_from_the_validation_at_that_step(tmp_path):
    L.seed_everything(0)
    model, cb = PlainClassifier(), callback(early_epochs=None, early_steps=8, late_steps=4)
    logger = CSVLogger(tmp_path, name="run")
    trainer(tmp_path, [cb], logger=logger, max_steps=12, val_check_interval=8).fit(model, *loaders())
    rows = list(csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")))
    val_at_switch = [float(r["val/loss"]) for r in rows if r.get("val/loss") and int(r["step"]) == 7]
    assert cb.schedule.late_start_step == 8 and val_at_switch
    assert cb.loss_target_value == pytest.approx(val_at_switch[0])


class UnderscoreArgs(PlainClassifier):
    """A training_step whose batch index is named ``_`` (as in examples/quickstart.py)."""

    def training_step(self, batch, _):
        return super().training_step(batch, _)


class BatchOnly(PlainClassifier):
    def training_step(self, batch):
        return super().training_step(batch, 0)


class IteratorStep(PlainClassifier):
    def training_step(self, dataloader_iter):
        (x, y), _, _ = next(dataloader_iter)
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, batch_size=len(y))
        return loss


@pytest.mark.parametrize("module", [UnderscoreArgs, BatchOnly, IteratorStep])
def test_training_step_gets_the_arguments_its_signature_asks_for(tmp_path, module):
    L.seed_everything(0)
    model, cb = module(), callback()
    trainer(tmp_path, [cb], max_epochs=3).fit(model, *loaders())
    assert cb.stage == "late" and cb.prune_events >= 1


def test_a_misspelt_loss_target_metric_fails_after_the_first_validated_epoch(tmp_path):
    L.seed_everything(0)
    model, cb = PlainClassifier(), callback(early_epochs=3, loss_target_metric="val/los")
    t = trainer(tmp_path, [cb], max_epochs=4)
    with pytest.raises(ValueError, match=r"loss_target_metric='val/los' is not logged \(by the end of epoch 0.*'val/loss'"):
        t.fit(model, *loaders())
    assert t.current_epoch == 1, "found after the first epoch, not at the stage switch"


class EpochEndMetric(PlainClassifier):
    def on_train_epoch_end(self):
        self.log("my/epoch_metric", 1.0)


def test_a_loss_target_metric_logged_in_the_modules_own_epoch_end_is_accepted(tmp_path):
    L.seed_everything(0)
    model, cb = EpochEndMetric(), callback(early_epochs=2, loss_target_metric="my/epoch_metric")
    trainer(tmp_path, [cb], max_epochs=3).fit(model, *loaders())
    assert cb.loss_target_value == 1.0


def test_a_layer_pruned_to_rank_zero_is_reported_and_logged(tmp_path):
    L.seed_everything(0)
    model, cb = PlainClassifier(), callback(early_epochs=1, gate_lr=3e-2, late_objective="paper",  # guarded spares a bond's last rank
                                            budget=BudgetConfig(allow_rank0=True))
    logger = CSVLogger(tmp_path, name="run")
    with pytest.warns(UserWarning, match=r"pruned to rank 0 on a bond: each now outputs its bias only"):
        trainer(tmp_path, [cb], logger=logger, max_epochs=4).fit(model, *loaders())
    assert any(0 in layer.physical_ranks for _, layer in tt_layers(model))
    rows = list(csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")))
    assert max(float(r["comera/layers_rank0"]) for r in rows if r.get("comera/layers_rank0")) >= 1


def test_a_checkpoint_with_other_tensorized_layers_fails_with_one_clear_error(tmp_path):
    L.seed_everything(0)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer(tmp_path, [callback(), ckpt], max_epochs=1).fit(PlainClassifier(), *loaders())
    other = callback(target_modules=["encoder.0"])
    with pytest.raises(ValueError, match=r"only in the checkpoint \['encoder.2'\].*use the same settings"):
        trainer(tmp_path, [other], max_epochs=2).fit(PlainClassifier(), *loaders(), ckpt_path=tmp_path / "ckpt" / "last.ckpt")


def test_a_dense_checkpoint_into_a_tensorized_run_fails_with_one_clear_error(tmp_path):
    L.seed_everything(0)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "dense", save_last=True)
    trainer(tmp_path, [ckpt], max_epochs=1).fit(PlainClassifier(), *loaders())
    with pytest.raises(ValueError, match=r"the checkpoint holds a dense model.*init='svd'"):
        trainer(tmp_path, [callback()], max_epochs=2).fit(PlainClassifier(), *loaders(), ckpt_path=tmp_path / "dense" / "last.ckpt")


def test_callback_tensorize_options():
    from comera_lightning import TensorizeConfig

    cb = ComeraCallback(max_rank=12, tensorize=TensorizeConfig(embedding_max_rank=40))
    assert cb.tensorize_config.max_rank == 12 and cb.tensorize_config.embedding_max_rank == 40
    with pytest.raises(TypeError, match="embedding_max_rank"):
        ComeraCallback(embedding_max_rank=40)  # only in tensorize=TensorizeConfig(...)
    assert ComeraCallback(tensorize={"max_rank": 6}).tensorize_config.max_rank == 6, "a dict, as a checkpoint records it"
    with pytest.raises(ValueError, match="gate_threshold"):
        ComeraCallback(gate_threshold=1.0)


def test_callback_state_with_unknown_keys_is_refused():
    cb = ComeraCallback()
    with pytest.raises(KeyError, match="unknown keys"):
        cb.load_state_dict({**cb.state_dict(), "bogus": 1})


def test_the_last_logged_sizes_are_the_model_after_its_last_prune(tmp_path):
    L.seed_everything(0)
    model, cb = PlainClassifier(), callback(early_epochs=2)
    logger = CSVLogger(tmp_path, name="run")
    t = trainer(tmp_path, [cb], logger=logger, max_epochs=2)  # training ends in the early stage: one prune at the end
    t.fit(model, *loaders())
    assert cb.stage == "final" and cb.prune_events == 1
    assert float(t.callback_metrics["comera/params_model"]) == physical_size(model)
    rows = [r for r in csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")) if r.get("comera/params_model")]
    assert float(rows[-1]["comera/params_model"]) == physical_size(model)
    assert int(rows[-1]["step"]) == t.global_step
