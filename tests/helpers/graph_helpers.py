"""Shared pieces of the CUDAGraphStrategy tests that run captured steps on CPU (see cuda_graph_emulator)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.strategies import SingleDeviceStrategy

from comera_lightning import ComeraCallback, CUDAGraphStrategy, TensorizeConfig
from tests.helpers.plain_modules import PlainClassifier, loaders


class MemoryLogger(Logger):
    """Every logged metric by step, in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    name = property(lambda self: "memory")
    version = property(lambda self: 0)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def series(self, name: str) -> dict[int, float]:
        """``name``'s value at each step it was logged."""
        return {step: m[name] for step, m in self.rows if name in m}


def comera(**kwargs: Any) -> ComeraCallback:
    # The paper's layout and late stage: what these graph tests were written for (six-core trains, every layer).
    layout = TensorizeConfig(num_cores=3, embedding_num_cores=4, include_attention=True, include_embeddings=True, include_heads=False,
                             min_compression=2.0)
    kwargs = {"max_rank": 8, "rank_weight": 0.5, "target_ratio": 0.3, "gate_lr": 3e-2, "late_objective": "paper", "core_step_scale": 1.0,
              "tensorize": layout, **kwargs}
    return ComeraCallback(**kwargs)


def run(strategy, make_model=PlainClassifier, callbacks=(), data=None, tmp_path=None, logger=False, **trainer_kwargs):
    """Fit ``make_model()`` (made after seeding) on CPU under ``strategy``; returns (model, trainer)."""
    L.seed_everything(0)
    model = make_model()
    trainer_kwargs = {"max_steps": 16, "enable_checkpointing": False, "limit_val_batches": 0, **trainer_kwargs}
    trainer = L.Trainer(
        accelerator="cpu", devices=1, strategy=strategy, callbacks=list(callbacks), logger=logger, default_root_dir=tmp_path,
        enable_progress_bar=trainer_kwargs.pop("enable_progress_bar", False), enable_model_summary=False,
        log_every_n_steps=1, **trainer_kwargs,
    )
    trainer.fit(model, *(data or loaders()))
    return model, trainer


def graphed(**kwargs: Any) -> CUDAGraphStrategy:
    """The strategy on CPU (the emulator lets it capture there), warming up for 2 steps by default."""
    return CUDAGraphStrategy(device="cpu", warmup_steps=kwargs.pop("warmup_steps", 2), **kwargs)


def eager() -> SingleDeviceStrategy:
    return SingleDeviceStrategy("cpu")


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert p.shape == q.shape, f"{name}: shapes differ"
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=f"{name} differs from the eager run")
