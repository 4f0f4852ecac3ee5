"""``comera-lightning export`` and ``comera-lightning predict --program``: the exported model from the command line.

    comera-lightning export  --config configs/transformer.yaml --ckpt_path path/to/last.ckpt --out model.pt2 [--overwrite]
                             [--prefer size|speed] [--hot_rows BYTES]
    comera-lightning predict --config configs/transformer.yaml --program model.pt2 [--predictions preds.pt]

``export`` builds the config's model and data module, loads the (tensorized) checkpoint and writes
``comera_lightning.export`` of it, with the first test batch as the example inputs, ``--prefer`` and
``--hot_rows`` as ``export``'s ``prefer`` and ``hot_rows`` (a budget in bytes per table), and prints the
form each TT layer took, its bytes and why. ``predict
--program`` runs an exported file over the data module's test split with torch alone (no
LightningModule): it prints the samples seen and, where the batches carry labels, the accuracy
(class argmax; a click logit > 0; the masked tokens' argmax), and saves the outputs with
``--predictions``. Without ``--program``, ``predict`` is LightningCLI's own. Any other flag
(``--data.init_args.batch_size 64``) overrides the config as in ``fit``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from comera_lightning.export.choice import PREFER

__all__ = ["export_main", "model_inputs", "predict_main"]


def _instantiate(overrides: Sequence[str]) -> tuple[Any, Any]:
    """The config's model and data module (no trainer run, no loggers)."""
    from comera_lightning.cli.app import ComeraCLI

    cli = ComeraCLI(args=[*overrides, "--trainer.logger=false", "--wandb=disabled"], run=False)
    return cli.model, cli.datamodule


def _test_batches(datamodule: Any):
    datamodule.setup("test")
    return datamodule.test_dataloader()


def model_inputs(batch: Any, feature_names: list[str] | None = None) -> tuple[torch.Tensor, ...]:
    """The positional inputs of a workload model (and of its exported program) for one batch.

    Token batches (dicts): ``input_ids`` then ``attention_mask`` then ``token_type_ids``, as far as present.
    Click batches: ``(dense, ids)`` with ``ids = kjt_to_ids(sparse, feature_names)``.
    """
    if hasattr(batch, "sparse") and hasattr(batch, "dense"):
        from comera_lightning.export.dlrm import kjt_to_ids

        return batch.dense, kjt_to_ids(batch.sparse, feature_names)
    inputs = []
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        if key not in batch:
            break
        inputs.append(batch[key])
    if not inputs:
        raise ValueError(f"predict/export: a batch with keys {sorted(batch)} has no input_ids; only token and click batches are supported.")
    return tuple(inputs)


def _load_checkpoint(model: torch.nn.Module, path: Path) -> None:
    from comera_lightning.checkpoint import restore_tensorized

    if not path.is_file():
        raise FileNotFoundError(f"export: --ckpt_path {path} is not a file; give the .ckpt written by fit (e.g. .../checkpoints/last.ckpt).")
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    restore_tensorized(model, checkpoint)
    model.load_state_dict(checkpoint["state_dict"])


def export_main(args: Sequence[str]) -> Path:
    """``comera-lightning export``: checkpoint -> exported program file."""
    parser = argparse.ArgumentParser(prog="comera-lightning export", description="Export a trained checkpoint for inference.")
    parser.add_argument("--ckpt_path", required=True, help="the checkpoint written by fit")
    parser.add_argument("--out", required=True, help="the program file to write (.pt2)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--prefer", choices=PREFER, default="size",
                        help="size (default): every TT layer in its smallest form; speed: small tables and layers expanded, "
                             "large tables' misses served from half tables, where faster")
    parser.add_argument("--hot_rows", type=int, default=None, metavar="BYTES",
                        help="keep each table's most frequent counted rows, up to BYTES per table (default: none with "
                             "--prefer size, the table's cache_rows with speed; 0: none)")
    ours, overrides = parser.parse_known_args(args)
    out = Path(ours.out)
    if out.exists() and not ours.overwrite:
        parser.error(f"--out {out} exists; pass --overwrite to replace it or choose another path.")
    model, datamodule = _instantiate(overrides)
    _load_checkpoint(model, Path(ours.ckpt_path))
    from comera_lightning.export import export_with_report
    from comera_lightning.export.dlrm import feature_names, is_dlrm

    names = feature_names(model) if is_dlrm(model) else None
    example = model_inputs(next(iter(_test_batches(datamodule))), names)
    _, report = export_with_report(model, example, out, prefer=ours.prefer, hot_rows=ours.hot_rows, overwrite=ours.overwrite)
    print(report)
    print(f"exported {type(model).__name__} to {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return out


def _correct(outputs: torch.Tensor, batch: Any) -> tuple[int, int]:
    """(correct, counted) predictions of one batch, from its labels; (0, 0) without labels."""
    labels = batch.labels if hasattr(batch, "labels") else batch.get("labels") if isinstance(batch, dict) else None
    if labels is None:
        return 0, 0
    if outputs.dim() == 1:  # click logits
        return int(((outputs > 0).float() == labels).sum()), labels.numel()
    predicted = outputs.argmax(-1)
    counted = labels != -100
    return int((predicted == labels)[counted].sum()), int(counted.sum())


def predict_main(args: Sequence[str]) -> torch.Tensor:
    """``comera-lightning predict --program``: run an exported file over the test split."""
    parser = argparse.ArgumentParser(prog="comera-lightning predict", description="Run an exported program on the test split.")
    parser.add_argument("--program", required=True, help="a file written by comera-lightning export")
    parser.add_argument("--predictions", default=None, help="save the concatenated outputs here (torch.save)")
    ours, overrides = parser.parse_known_args(args)
    program = torch.export.load(ours.program).module()
    model, datamodule = _instantiate(overrides)
    from comera_lightning.export.dlrm import feature_names, is_dlrm

    names = feature_names(model) if is_dlrm(model) else None
    outputs, correct, counted = [], 0, 0
    with torch.inference_mode():
        for batch in _test_batches(datamodule):
            out = program(*model_inputs(batch, names))
            hits, seen = _correct(out, batch)
            correct, counted = correct + hits, counted + seen
            outputs.append(out.flatten(0, -2) if out.dim() > 2 else out)
    result = torch.cat(outputs)
    accuracy = f", accuracy {correct / counted:.4f} over {counted} labels" if counted else ""
    print(f"predicted {result.shape[0]} rows with {ours.program}{accuracy}")
    if ours.predictions:
        torch.save(result, ours.predictions)
    return result
