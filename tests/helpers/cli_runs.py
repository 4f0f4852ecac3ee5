"""The bundled configs and the overrides that make a CLI run short (the cli tests)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.paths import CONFIGS, ROOT  # noqa: F401  (ROOT: for the cli tests)

TINY_CONFIGS = sorted(CONFIGS.glob("*_tiny.yaml"))
ALL_CONFIGS = sorted(CONFIGS.glob("*.yaml"))
# Keep data loading small for the configs whose data module allows it (tokenizers train on these few).
DATA_OVERRIDES = {
    "transformer_tiny": ["--data.init_args.limit_train_samples", "256", "--data.init_args.limit_eval_samples", "64"],
    "codebert_tiny": ["--data.init_args.max_files", "30"],
}
FEW_STEPS = [
    "--trainer.max_epochs", "1", "--trainer.max_steps", "4",
    "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1",
    # 2 early steps, then a late stage with its prune: the whole schedule in 4 steps.
    "--comera.early_epochs", "null", "--comera.late_epochs", "null", "--comera.prune_every_n_epochs", "null",
    "--comera.early_steps", "2", "--comera.late_steps", "2",
]


def small(config: Path) -> list[str]:
    """``--config <config>`` and the overrides that keep its data small."""
    return ["--config", str(config), *DATA_OVERRIDES.get(config.stem, [])]
