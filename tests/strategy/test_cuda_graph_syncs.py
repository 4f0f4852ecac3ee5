"""CUDAGraphStrategy's captured steps on CPU (cuda_graph_emulator): host syncs, hook logs, devices, checkpoints, ids.

Defects 6 and 7 of issue 20; 1-5 are in test_cuda_graph_replay.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.callbacks import GradientAccumulationScheduler, ModelCheckpoint, TQDMProgressBar
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from comera_lightning import CUDAGraphStrategy, TTEmbedding
from tests.helpers.cuda_graph_emulator import HostSyncCounter, emulate_cuda_graphs
from tests.helpers.graph_helpers import MemoryLogger, assert_same_weights, eager, graphed, run
from tests.helpers.plain_modules import PlainClassifier, loaders


@pytest.fixture
def graphs(monkeypatch):
    with emulate_cuda_graphs(monkeypatch, CUDAGraphStrategy) as emulated:
        yield emulated


class MetricClassifier(PlainClassifier):
    """Logs a torchmetrics accuracy (shown on the progress bar) and a gradient norm from ``on_before_optimizer_step``."""

    def __init__(self):
        super().__init__()
        self.acc = MulticlassAccuracy(4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.acc(logits.argmax(-1), y)
        self.log("train_acc", self.acc, prog_bar=True)
        return nn.functional.cross_entropy(logits, y)

    def on_before_optimizer_step(self, optimizer):
        self.log("grad_norm", self.head.weight.grad.norm(), on_step=True, on_epoch=True)


# ---------------------------------------------------------------------------------------- 6: host syncs
def test_6_replayed_steps_make_no_host_sync(graphs):
    strategy = graphed()
    counts = []
    step = strategy.optimizer_step

    def counted(*args, **kwargs):
        before = sum(g.replays for g in graphs.instances)
        with HostSyncCounter() as syncs:
            result = step(*args, **kwargs)
        if sum(g.replays for g in graphs.instances) > before:
            counts.append(len(syncs.calls))
        return result

    strategy.optimizer_step = counted
    model, _ = run(strategy, MetricClassifier)
    assert len(counts) >= 12 and counts == [0] * len(counts), f"host syncs per replayed step: {counts}"
    assert model.acc.validate_args, "the metric's own setting is back after training"


def test_6_a_progress_bar_refreshing_every_step_is_named_as_a_host_sync(graphs):
    with pytest.warns(UserWarning, match=r"progress bar refreshes every step.*refresh_rate=20"):
        run(graphed(), MetricClassifier, callbacks=[TQDMProgressBar(refresh_rate=1)], enable_progress_bar=True)


# ---------------------------------------------------------------------------------------- 7: the list
def test_7_logs_of_the_hooks_inside_the_step_follow_every_replay(graphs):
    logs = {}
    for name, strategy in (("graph", graphed()), ("eager", eager())):
        logs[name] = MemoryLogger()
        run(strategy, MetricClassifier, logger=logs[name])
    for metric, times in (("grad_norm_step", 16), ("grad_norm_epoch", 1), ("train_acc", 16)):
        graph, reference = logs["graph"].series(metric), logs["eager"].series(metric)
        assert len(graph) == times and graph.keys() == reference.keys(), f"{metric} logged at steps {sorted(graph)}"
        torch.testing.assert_close(torch.tensor(list(graph.values())), torch.tensor(list(reference.values())), rtol=1e-4, atol=1e-5)


def _trainer_asking_for(*devices: torch.device) -> SimpleNamespace:
    return SimpleNamespace(_trainer=SimpleNamespace(_accelerator_connector=SimpleNamespace(_parallel_devices=list(devices))))


def test_7_the_trainers_cuda_device_is_the_one_trained_on_and_several_are_refused():
    strategy = CUDAGraphStrategy()
    strategy._accelerator = CUDAAccelerator()
    strategy._lightning_module = _trainer_asking_for(torch.device("cuda", 1))  # Trainer(devices=[1])
    assert strategy.root_device == torch.device("cuda", 1)
    strategy._lightning_module = _trainer_asking_for(torch.device("cuda", 0), torch.device("cuda", 1))  # devices=2
    with pytest.raises(ValueError, match=r"trains on one device, but the Trainer asks for 2 .*devices=\[i\]"):
        strategy.root_device
    assert CUDAGraphStrategy(device="cuda:3").root_device == torch.device("cuda", 3)


class ScheduledClassifier(PlainClassifier):
    def __init__(self):
        super().__init__(cosine=True)


def test_7_checkpoints_and_the_optimizer_after_training_hold_no_capture_settings(graphs, tmp_path):
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_last=True)
    model, trainer = run(graphed(), ScheduledClassifier, callbacks=[saver], enable_checkpointing=True, tmp_path=tmp_path)
    assert trainer.strategy.graph_cache.captures == 1
    ckpt = torch.load(tmp_path / "last.ckpt", weights_only=False)
    group = ckpt["optimizer_states"][0]["param_groups"][0]
    assert type(group["lr"]) is float and group["capturable"] is False
    assert all(s["step"].device.type == "cpu" for s in ckpt["optimizer_states"][0]["state"].values())
    assert all(type(lr) is float for lr in ckpt["lr_schedulers"][0]["_last_lr"])
    optimizer = trainer.optimizers[0]
    assert type(optimizer.param_groups[0]["lr"]) is float and optimizer.param_groups[0]["capturable"] is False
    assert optimizer.defaults["capturable"] is False


class IdClassifier(PlainClassifier):
    """A TTEmbedding of 47 rows (row modes 6·8 = 48: id 47 would silently read a padding row)."""

    def __init__(self):
        super().__init__()
        self.embed = TTEmbedding(47, 64, max_rank=4, row_modes=(6, 8), num_cores=2)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        return nn.functional.cross_entropy(self(self.embed(ids).mean(1)), y)


def test_7_ids_out_of_range_are_caught_on_replayed_steps(graphs):
    ids = torch.randint(0, 47, (64, 5), generator=torch.Generator().manual_seed(0))
    ids[40, 2] = 47  # batch 5 of 8: a replayed step
    data = (DataLoader(TensorDataset(ids, torch.randint(0, 4, (64,))), batch_size=8),)
    with pytest.raises(RuntimeError, match="out of range for a TTEmbedding of 47 rows"):
        run(graphed(), IdClassifier, data=data, max_steps=8)


def test_7_a_gradient_accumulation_schedule_turns_graphs_off_when_it_starts_accumulating(graphs):
    accumulate = GradientAccumulationScheduler({1: 2})
    with pytest.warns(UserWarning, match="accumulate_grad_batches changed to 2 during training"):
        model, trainer = run(graphed(), callbacks=[accumulate], max_epochs=2, max_steps=-1)
    assert trainer.strategy.graph_cache.replays > 0 and not trainer.strategy.graph_cache.graphs
    reference, _ = run(eager(), callbacks=[GradientAccumulationScheduler({1: 2})], max_epochs=2, max_steps=-1)
    assert_same_weights(model, reference)


class OutsideParameter(PlainClassifier):
    """A parameter in the forward but not in the optimizer: its .grad accumulates over the eager steps."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return super().forward(x) * self.scale

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p is not self.scale], lr=self.hparams.lr)


def test_7_a_parameter_outside_the_optimizer_turns_graphs_off_and_keeps_accumulating_as_eagerly(graphs):
    data = loaders(n=80, batch_size=32)  # two batch keys
    with pytest.warns(UserWarning, match=r"\['scale'\] require grad but no optimizer clears their .grad"):
        model, _ = run(graphed(), OutsideParameter, data=data)
    reference, _ = run(eager(), OutsideParameter, data=data)
    torch.testing.assert_close(model.scale.grad, reference.scale.grad, rtol=1e-4, atol=1e-5)
    assert_same_weights(model, reference)
