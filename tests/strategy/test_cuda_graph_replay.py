"""CUDAGraphStrategy's captured steps on CPU (cuda_graph_emulator): hyper-parameters, NaN, logs, memory, re-captures.

Each test names the defect of issue 20 it guards (defects 6-7 are in test_cuda_graph_syncs.py).
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from comera_lightning import CUDAGraphStrategy, TTLinear
from comera_lightning.schedule import ComeraObjective
from tests.helpers.cuda_graph_emulator import emulate_cuda_graphs
from tests.helpers.graph_helpers import MemoryLogger, assert_same_weights, comera, eager, graphed, run
from tests.helpers.plain_modules import PlainClassifier, loaders


@pytest.fixture
def graphs(monkeypatch):
    with emulate_cuda_graphs(monkeypatch, CUDAGraphStrategy) as emulated:
        yield emulated


class WarmupClassifier(PlainClassifier):
    """Lightning's documented LR warm-up: a float written into the param groups in ``optimizer_step``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.lr_types_at_capture: list[type] = []

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        for group in optimizer.param_groups:
            group["lr"] = self.hparams.lr * min(1.0, (self.trainer.global_step + 1) / 12)
        optimizer.step(closure=optimizer_closure)

    def on_before_optimizer_step(self, optimizer):
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            self.lr_types_at_capture.append(type(optimizer.param_groups[0]["lr"]))


# ---------------------------------------------------------------------------------------- 1: frozen hyper-parameters
def test_1_a_float_lr_written_before_the_step_is_not_frozen_into_the_graph(graphs):
    model, trainer = run(graphed(), WarmupClassifier)
    assert trainer.strategy.graph_cache.captures == 1 and sum(g.replays for g in graphs.instances) >= 12
    assert model.lr_types_at_capture == [torch.Tensor], "the graph must read the LR from its device tensor"
    reference, _ = run(eager(), WarmupClassifier)
    assert_same_weights(model, reference)


class MomentumChange(PlainClassifier):
    """Changes Adam's betas once, at step ``change_at`` (as a momentum schedule would)."""

    change_at = 8

    def on_train_batch_start(self, batch, batch_idx):
        if self.trainer.global_step == self.change_at:
            self.trainer.optimizers[0].param_groups[0]["betas"] = (0.5, 0.9)


class LateMomentumChange(MomentumChange):
    change_at = 14


def test_1_a_changed_beta_recaptures_and_one_that_changes_every_step_turns_graphs_off(graphs):
    model, trainer = run(graphed(), MomentumChange)
    assert trainer.strategy.graph_cache.invalidations == 1 and trainer.strategy.graph_cache.captures == 2
    reference, _ = run(eager(), MomentumChange)
    assert_same_weights(model, reference)

    with pytest.warns(UserWarning, match=r"group0\.betas.*changed 3 times in a row.*cycle_momentum=False"):
        model, trainer = run(graphed(), OneCycleClassifier, max_steps=24)
    assert trainer.strategy.graph_cache.replays == 0 and not trainer.strategy.graph_cache.graphs
    reference, _ = run(eager(), OneCycleClassifier, max_steps=24)
    assert_same_weights(model, reference)


class OneCycleClassifier(PlainClassifier):
    """OneCycleLR, which cycles Adam's beta1 every step."""

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=self.trainer.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


# ---------------------------------------------------------------------------------------- 2: NaN on a replayed step
class PoisonedClassifier(PlainClassifier):
    """Its loss turns NaN at step 8 through a device buffer (a Python ``if`` would be frozen at capture)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("poison", torch.ones(()))

    def on_train_batch_start(self, batch, batch_idx):
        if self.trainer.global_step == 8:
            self.poison.fill_(float("nan"))

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * self.poison


def test_2_a_nan_loss_on_a_replayed_step_stops_training_before_the_next_checkpoint(graphs, tmp_path):
    every_step = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, save_last=True)
    with pytest.raises(FloatingPointError, match=r"not finite \(NaN or inf\) at global step 8, a replayed CUDA-graph step"):
        run(graphed(), PoisonedClassifier, callbacks=[every_step], enable_checkpointing=True, tmp_path=tmp_path)
    saved = sorted(tmp_path.glob("*.ckpt"))
    assert saved, "the steps before the NaN were saved"
    for path in saved:
        ckpt = torch.load(path, weights_only=False)
        assert ckpt["global_step"] <= 8, f"{path.name}: written after the NaN step"
        assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values()), f"{path.name} holds NaN weights"


# ---------------------------------------------------------------------------------------- 3: stale comera/* logs
def test_3_the_objective_keeps_its_logged_terms_in_the_same_tensors():
    objective = ComeraObjective()
    objective.bind([TTLinear(16, 16, max_rank=4)])
    objective(torch.tensor(2.0), "early")
    kept = objective.last["task_loss"]
    objective(torch.tensor(3.0), "early")
    assert objective.last["task_loss"] is kept and kept.item() == 3.0, "a graph's replays write these tensors"


def test_3_comera_logs_follow_every_replay_of_two_batch_shapes(graphs):
    data = loaders(n=80, batch_size=32)  # 32, 32, 16: two batch keys, each captured
    schedule = dict(early_steps=100)
    logs = {}
    for name, strategy in (("graph", graphed()), ("eager", eager())):
        logger = MemoryLogger()
        _, trainer = run(strategy, callbacks=[comera(**schedule)], data=data, logger=logger, max_steps=24)
        logs[name] = logger
    assert trainer.strategy is not None and len(graphs.instances) == 2
    for metric in ("comera/task_loss", "comera/size_surrogate", "train_loss"):
        graph, reference = logs["graph"].series(metric), logs["eager"].series(metric)
        assert len(graph) == 24 and graph.keys() == reference.keys()
        torch.testing.assert_close(torch.tensor(list(graph.values())), torch.tensor(list(reference.values())),
                                   rtol=1e-4, atol=1e-5, msg=f"{metric} is stale on replayed steps")


# ---------------------------------------------------------------------------------------- 4: memory
def test_4_graphs_share_one_pool_until_the_next_invalidation(graphs):
    data = loaders(n=80, batch_size=32)
    _, trainer = run(graphed(), LateMomentumChange, data=data, max_steps=30)
    first, later = graphs.instances[:2], graphs.instances[2:]
    assert len(first) == 2 and first[0].pool is not None and first[0].pool is first[1].pool, "both keys share a pool"
    assert later and all(g.pool is later[0].pool for g in later) and later[0].pool is not first[0].pool


class GraphsKept(Callback):
    """How many graphs the strategy holds after each step where graphs were off."""

    def __init__(self):
        self.after_refusal: list[int] = []

    def on_train_batch_end(self, trainer, *args):
        if trainer.strategy.refusal is not None:
            self.after_refusal.append(len(trainer.strategy.graph_cache.graphs))


def test_4_a_failed_capture_frees_the_graphs_already_captured(graphs):
    data = loaders(n=80, batch_size=32)
    graphs.fail_capture_number = 2  # the second key's capture runs out of memory
    kept = GraphsKept()
    with pytest.warns(UserWarning, match="capturing the training step failed .*OutOfMemoryError"):
        model, trainer = run(graphed(), data=data, max_steps=20, callbacks=[kept])
    assert trainer.strategy.refusal.startswith("capturing the training step failed")
    assert kept.after_refusal and set(kept.after_refusal) == {0}, "the first key's graph was freed with the failure"
    reference, _ = run(eager(), data=data, max_steps=20)
    assert_same_weights(model, reference)


# ---------------------------------------------------------------------------------------- 5: needless re-captures
def test_5_a_prune_that_removes_nothing_keeps_the_graphs(graphs):
    cb = comera(gate_lr=1e-9, early_steps=4, prune_every_n_steps=3)  # gates barely move: no prune removes anything
    model, trainer = run(graphed(), callbacks=[cb], max_steps=24)
    strategy = trainer.strategy
    assert cb.prune_events >= 5 and cb.stage == "late"
    assert strategy.graph_cache.invalidations == 1, "only the stage switch (a new objective) re-captures"
    assert strategy.graph_cache.captures == 2
    reference, _ = run(eager(), callbacks=[comera(gate_lr=1e-9, early_steps=4, prune_every_n_steps=3)], max_steps=24)
    assert_same_weights(model, reference)


def test_6_the_core_step_scale_applies_inside_captured_steps(graphs):
    """Captured steps stretch the cores' steps as eager ones do (the hooks' copies and adds are replayed with the step)."""
    scaled, trainer = run(graphed(), callbacks=[comera(core_step_scale=4.0, early_steps=4)], max_steps=6)
    assert trainer.strategy.graph_cache.captures >= 1 and sum(g.replays for g in graphs.instances) >= 2
    assert_same_weights(scaled, run(eager(), callbacks=[comera(core_step_scale=4.0, early_steps=4)], max_steps=6)[0])
    plain, _ = run(eager(), callbacks=[comera(core_step_scale=1.0, early_steps=4)], max_steps=6)
    with pytest.raises(AssertionError):
        assert_same_weights(scaled, plain)
