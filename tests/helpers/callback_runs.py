"""A short CPU Trainer, a ComeraCallback set to move fast, and a deep equality of checkpoint states (callback tests)."""

import lightning as L
import torch

from comera_lightning import ComeraCallback


def trainer(tmp_path, callbacks, **kwargs):
    kwargs.setdefault("max_epochs", 4)
    return L.Trainer(
        accelerator="cpu", devices=1, callbacks=callbacks, default_root_dir=tmp_path,
        logger=kwargs.pop("logger", False), enable_progress_bar=False, enable_model_summary=False,
        log_every_n_steps=4, **kwargs,
    )


def callback(**kwargs):
    kwargs.setdefault("max_rank", 8)
    kwargs.setdefault("early_epochs", 2)
    kwargs.setdefault("rank_weight", 0.5)
    kwargs.setdefault("target_ratio", 0.3)
    kwargs.setdefault("gate_lr", 3e-2)  # short runs: gates must move fast
    kwargs.setdefault("late_objective", "guarded")  # these runs test the gates' own pruning; the budget's: tests/callback/test_budget.py
    return ComeraCallback(**kwargs)


def assert_same(a, b, where="state"):
    """Equal nested dicts/lists of tensors and plain values."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where
