"""CUDAGraphStrategy: the package's names, the CPU path with the callback and pruning, refusals, YAML, GPU parity.

The capture machinery alone is tested in test_capture.py.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics.classification import MulticlassAccuracy

import comera_lightning.strategy as strategy_package
from comera_lightning import CAME, ComeraCallback, CUDAGraphStrategy
from comera_lightning.cli.app import ComeraCLI
from comera_lightning.strategy import capture, cuda_graph
from tests.helpers.paths import ROOT
from tests.helpers.plain_modules import PlainClassifier, loaders


def callback(**kwargs) -> ComeraCallback:
    kwargs.setdefault("max_rank", 8)
    kwargs.setdefault("rank_weight", 0.5)
    kwargs.setdefault("target_ratio", 0.3)
    kwargs.setdefault("gate_lr", 3e-2)  # short runs: gates must move fast
    return ComeraCallback(**kwargs)


def fit(tmp_path, strategy, model=None, cb=None, accelerator="cpu", logger=False, data=None, **kwargs):
    L.seed_everything(0)
    model = model or PlainClassifier()
    cb = cb or callback(early_epochs=2)
    kwargs.setdefault("max_epochs", 4)
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, strategy=strategy, callbacks=[cb], logger=logger,
        default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        log_every_n_steps=1, **kwargs,
    )
    trainer.fit(model, *(data or loaders()))
    return model, cb, trainer


# ---------------------------------------------------------------------------------------- CPU runs
def test_cpu_fit_with_callback_and_pruning_matches_the_default_strategy(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        model, cb, trainer = fit(tmp_path, CUDAGraphStrategy())
    strategy = trainer.strategy
    assert strategy.root_device == torch.device("cpu")
    assert strategy.refusal == "no CUDA device (training on cpu)"
    assert caplog.text.count("CUDAGraphStrategy: no CUDA device") == 1, "the reason is said once"
    assert cb.stage == "late" and cb.prune_events >= 2
    assert strategy.graph_cache.invalidations == 0, "graphs are off on CPU: nothing to drop"
    assert sum(model.encoder[0].physical_ranks) < 4 + 8 + 8 + 8 + 8, "ranks shrink physically"
    assert all(torch.isfinite(p).all() for p in model.parameters())

    reference, _, _ = fit(tmp_path, SingleDeviceStrategy("cpu"))
    for (name, p), q in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(p, q), f"{name}: on CPU the strategy must run exactly the default step"


def test_cpu_fit_with_came_and_a_step_schedule(tmp_path):
    cb = callback(early_steps=4, late_steps=6, prune_every_n_steps=2)
    model, cb, trainer = fit(tmp_path, CUDAGraphStrategy(), model=PlainClassifier(optimizer="came"), cb=cb, max_steps=12)
    assert cb.stage == "final" and cb.prune_events >= 3
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---------------------------------------------------------------------------------------- package, arguments, refusals
def test_the_package_keeps_the_names_of_the_former_module():
    old = {"CUDAGraphStrategy", "GraphCache", "StepGraph", "UncapturableBatch", "batch_key", "deferring",
           "make_capturable_", "pad_to_bucket"}
    assert old <= set(strategy_package.__all__) and all(hasattr(strategy_package, n) for n in strategy_package.__all__)
    assert strategy_package.CUDAGraphStrategy is cuda_graph.CUDAGraphStrategy is CUDAGraphStrategy
    assert strategy_package.pad_to_bucket is capture.pad_to_bucket
    assert not hasattr(strategy_package, "compiled_children") and not hasattr(strategy_package, "set_compiled")


def test_init_arguments_are_checked():
    with pytest.raises(ValueError, match="buckets need pad_values"):
        CUDAGraphStrategy(buckets=[64, 128])
    with pytest.raises(ValueError, match="only used with buckets"):
        CUDAGraphStrategy(pad_values={"input_ids": 0})
    with pytest.raises(ValueError, match="warmup_steps must be an integer >= 1, got 0"):
        CUDAGraphStrategy(warmup_steps=0)
    with pytest.raises(ValueError, match="positive sequence lengths"):
        CUDAGraphStrategy(buckets=[0], pad_values={"input_ids": 0})
    assert CUDAGraphStrategy(device="cpu").root_device == torch.device("cpu")
    assert CUDAGraphStrategy(buckets=[128, 64, 64], pad_values={"input_ids": 0}).buckets == [64, 128]


def _refusal(optimizer=None, *, device="cuda:0", automatic=True, accumulate=1, precision=None, **kwargs):
    strategy = CUDAGraphStrategy(device=device, precision_plugin=precision, **kwargs)
    module = PlainClassifier()
    module.automatic_optimization = automatic
    strategy.optimizers = [optimizer or torch.optim.AdamW(module.parameters())]
    return strategy.capture_refusal(SimpleNamespace(lightning_module=module, accumulate_grad_batches=accumulate))


def test_what_the_strategy_refuses_to_capture_and_why():
    assert _refusal() is None
    assert _refusal(CAME([nn.Parameter(torch.zeros(2, 2))], lr=1e-3)) is None
    assert _refusal(device="cpu") == "no CUDA device (training on cpu)"
    assert _refusal(cuda_graphs=False) == "cuda_graphs=False"
    assert "manual optimization" in _refusal(automatic=False)
    assert "accumulate_grad_batches=4" in _refusal(accumulate=4)
    with pytest.warns(UserWarning):  # no CUDA here: torch disables the scaler, but Lightning still uses one
        precision = MixedPrecision("16-mixed", "cuda")
    assert "16-mixed" in _refusal(precision=precision)
    assert "SGD has no 'capturable' option" in _refusal(torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1))


# ---------------------------------------------------------------------------------------- YAML / CLI
def test_tiny_transformer_config_selects_the_strategy_through_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("COMERA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    cli = ComeraCLI(args=[
        "fit", "--config", str(ROOT / "configs" / "transformer_tiny.yaml"),
        "--data.init_args.limit_train_samples", "128", "--data.init_args.limit_eval_samples", "32",
        "--trainer.strategy.init_args.buckets", "[32, 64]",
        "--trainer.strategy.init_args.pad_values", "{input_ids: 0, attention_mask: 0, token_type_ids: 0}",
        "--trainer.max_steps", "3", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1",
        "--comera.early_epochs", "null", "--comera.late_epochs", "null", "--comera.prune_every_n_epochs", "null",
        "--comera.early_steps", "1", "--comera.late_steps", "1",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path),
    ])
    strategy = cli.trainer.strategy
    assert isinstance(strategy, CUDAGraphStrategy) and strategy.buckets == [32, 64]
    assert cli.trainer.global_step == 3 and strategy.refusal == "no CUDA device (training on cpu)"


# ---------------------------------------------------------------------------------------- GPU
class TokenDataset(Dataset):
    """Token sequences of 3..8 tokens (first half) and 9..12 (second half); label = first token's parity."""

    def __init__(self, n: int = 96) -> None:
        g = torch.Generator().manual_seed(0)
        lengths = [3 + i % 6 if i < n // 2 else 9 + i % 4 for i in range(n)]
        self.items = [torch.randint(1, 50, (length,), generator=g) for length in lengths]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.items[i]


def collate_longest(items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    length = max(len(t) for t in items)
    ids = torch.zeros(len(items), length, dtype=torch.long)
    for row, t in enumerate(items):
        ids[row, : len(t)] = t
    return {"input_ids": ids, "attention_mask": (ids != 0).float(), "labels": ids[:, 0] % 2}


class MaskedMeanClassifier(L.LightningModule):
    """Embedding, masked mean over tokens, MLP head: padding does not change its loss."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 2))
        self.acc = MulticlassAccuracy(2)

    def training_step(self, batch, batch_idx):
        mask = batch["attention_mask"].unsqueeze(-1)
        pooled = (self.embed(batch["input_ids"]) * mask).sum(1) / mask.sum(1)
        logits = self.mlp(pooled)
        loss = nn.functional.cross_entropy(logits, batch["labels"])
        self.acc(logits.argmax(-1), batch["labels"])
        self.log("train_loss", loss)
        self.log("train_acc", self.acc)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def _params(model):
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["adamw", "came"])
def test_gpu_captured_steps_give_the_eager_weights_across_prunes(tmp_path, optimizer):
    schedule = dict(early_steps=6, late_steps=12, prune_every_n_steps=4)
    runs = {}
    for name in ("graph", "eager"):  # the eager run: Lightning's own strategy and the stock optimizer
        strategy = CUDAGraphStrategy(warmup_steps=2) if name == "graph" else SingleDeviceStrategy("cuda:0")
        L.seed_everything(0)  # both models start from the same weights
        model, cb, _ = fit(tmp_path / name, strategy, model=PlainClassifier(optimizer=optimizer),
                           cb=callback(**schedule), accelerator="cuda", max_steps=24)
        runs[name] = (model, cb, strategy)
    (graphed, cb, strategy), (eager, eager_cb, _) = runs["graph"], runs["eager"]
    assert strategy.refusal is None and strategy.graph_cache.captures >= 3, "captured before and after prunes"
    assert 1 <= strategy.graph_cache.invalidations <= cb.prune_events and cb.prune_events >= 3
    assert cb.prune_events == eager_cb.prune_events
    for (name, p), q in zip(_params(graphed).items(), _params(eager).values()):
        assert p.shape == q.shape, f"{name}: the same ranks were pruned"
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=f"{name} differs after captured steps")


@pytest.mark.gpu
def test_gpu_buckets_capture_one_graph_each_and_logs_follow_every_replay(tmp_path):
    data = (DataLoader(TokenDataset(), batch_size=8, collate_fn=collate_longest),)
    pads = {"input_ids": 0, "attention_mask": 0}
    logs = {}
    for name, warmup in (("graph", 1), ("eager", 10**6)):
        strategy = CUDAGraphStrategy(warmup_steps=warmup, buckets=[8, 16], pad_values=pads)
        logger = CSVLogger(tmp_path, name=name)
        L.seed_everything(0)
        model = MaskedMeanClassifier()
        trainer = L.Trainer(accelerator="cuda", devices=1, strategy=strategy, max_epochs=3, logger=logger,
                            log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False)
        trainer.fit(model, *data)
        rows = list(csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")))
        logs[name] = [float(r["train_loss"]) for r in rows if r.get("train_loss")]
        if name == "graph":
            assert strategy.refusal is None and strategy.graph_cache.captures == 2, "one graph per bucket (8 and 16)"
    assert len(set(logs["graph"])) > len(logs["graph"]) // 2, "logged values change with every replay"
    torch.testing.assert_close(torch.tensor(logs["graph"]), torch.tensor(logs["eager"]), rtol=1e-4, atol=1e-5)


class SyncingClassifier(PlainClassifier):
    """Draws random numbers (as dropout does), then reads the loss on the host inside the step: cannot be captured."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx) + 0.0 * torch.rand((), device=self.device)
        if loss.item() > 1e9:
            raise AssertionError("unreachable")
        return loss


@pytest.mark.gpu
def test_gpu_a_step_that_cannot_be_captured_runs_eagerly_with_a_warning(tmp_path):
    strategy = CUDAGraphStrategy(warmup_steps=1)
    with pytest.warns(UserWarning, match="capturing the training step failed"):
        model, cb, _ = fit(tmp_path, strategy, model=SyncingClassifier(), accelerator="cuda", max_epochs=3)
    assert strategy.refusal.startswith("capturing the training step failed") and strategy.graph_cache.captures == 0
    assert cb.prune_events >= 1 and all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.gpu
def test_gpu_a_failed_capture_leaves_the_random_numbers_as_they_were():
    torch.cuda.manual_seed(0)
    expected = torch.rand(4, device="cuda")
    torch.cuda.manual_seed(0)
    with pytest.raises(Exception):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.rand(4, device="cuda")
            torch.ones(1, device="cuda").item()  # a host sync invalidates the capture
    capture.end_failed_capture_rng(torch.device("cuda"))
    torch.testing.assert_close(torch.rand(4, device="cuda"), expected)
