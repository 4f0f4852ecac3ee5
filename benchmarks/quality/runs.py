"""One run of the quality race: a system trained at one peak LR, and every system of a race at one LR.

``race.py`` (one LR per run) and ``sweep.py`` (every system at every LR of ``--lrs``) both race through these;
``frontier.py`` trains its points with ``fit``. The systems and what is reported: ``race.py``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from benchmarks.quality.models import ModelSpec, narrow_width
from benchmarks.quality.settings import SYSTEMS, RaceSettings

__all__ = ["comera_callback", "fit", "print_result", "race_at_lr"]


def comera_callback(settings: RaceSettings) -> Any:
    """``ComeraCallback()`` with its defaults, plus the race's ``--comera`` / ``--tensorize`` overrides.

    In one pass over the data (``settings.one_pass``: no epochs to count) the defaults take their schedule from the
    Trainer's ``max_steps`` (the early stage two thirds of it, the budget's prunes over the late stage's first half).
    """
    from comera_lightning import ComeraCallback, TensorizeConfig

    options = dict(settings.comera)
    if settings.tensorize:
        options["tensorize"] = TensorizeConfig(**settings.tensorize)
    return ComeraCallback(**options)


def fit(system: str, spec: ModelSpec, settings: RaceSettings, data: Any, *, lr: float, steps: int, seed: int | None = None,
        per_epoch: int | None = None, **module_options: Any) -> tuple[dict[str, Any], Any]:
    """Train one system for ``steps`` at peak ``lr``; its result (curve, final loss, parameters, memory, seconds) and module.

    ``settings.epochs`` validations evenly spaced (each ending an epoch unless ``settings.one_pass``), or one every
    ``per_epoch`` steps when given (``dense_time``, whose steps are not the race's).
    """
    import lightning as L
    import torch

    from benchmarks.quality.lm import CausalLM, Curve
    from benchmarks.quality.models import layer_sizes, parameters
    from comera_lightning.rank import compression_stats

    seed = settings.seed if seed is None else seed
    torch.set_num_threads(settings.threads)
    L.seed_everything(seed, verbose=False)
    epochs = min(settings.epochs, steps) if per_epoch is None else max(1, round(steps / per_epoch))
    module = CausalLM(spec, data.vocab_size, settings.block_size, lr=lr, weight_decay=settings.weight_decay,
                      warmup=settings.warmup, min_lr=settings.min_lr, **module_options)
    curve = Curve(module.measure_step)
    callbacks = [curve, comera_callback(settings)] if system == "comera" else [curve]
    trainer = _trainer(settings, steps // epochs, epochs, callbacks)
    started = time.perf_counter()
    trainer.fit(module, datamodule=data)
    wall = time.perf_counter() - started
    if trainer.global_step < steps // epochs * epochs:
        raise SystemExit(f"{system} trained {trainer.global_step} of {steps} steps: an epoch of the data holds fewer than "
                         f"{steps // epochs} steps of batches; raise --max-bytes (or give more --data-files) or --epochs")
    points = [{**p, "tokens": p["step"] * settings.tokens_per_step} for p in curve.points]
    result = {
        "system": system, "model": spec.label(), "family": spec.family, "width": spec.width, "layers": spec.layers,
        "lr": lr, "seed": seed, "steps": trainer.global_step, "final_val_loss": points[-1]["val_loss"], "curve": points,
        "parameters": parameters(module), "tt_parameters": compression_stats(module).tt_parameters,
        "memory": module.memory, "train_seconds": round(curve.total_seconds, 1), "wall_seconds": round(wall, 1),
        "layer_sizes": layer_sizes(module.model),
    }
    return result, module


def _trainer(settings: RaceSettings, per_epoch: int, epochs: int, callbacks: list[Any]) -> Any:
    """A Trainer for ``epochs`` validations ``per_epoch`` optimizer steps apart (``settings.one_pass``: across
    one pass over the data, else each after an epoch of its own)."""
    import lightning as L

    batches = per_epoch * settings.accumulate
    if settings.one_pass:
        span = {"max_steps": per_epoch * epochs, "max_epochs": -1, "val_check_interval": batches,
                "check_val_every_n_epoch": None}
    else:
        span = {"max_epochs": epochs, "limit_train_batches": batches}
    return L.Trainer(**span, limit_val_batches=settings.val_batches, accumulate_grad_batches=settings.accumulate,
                     gradient_clip_val=settings.gradient_clip or None, precision=settings.precision,
                     num_sanity_val_steps=0, callbacks=callbacks, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, accelerator=settings.device, devices=1)


def print_result(result: dict[str, Any]) -> None:
    print(f"{result['model']} {result['system']:10s} lr {result['lr']:g} seed {result['seed']} val loss "
          f"{result['final_val_loss']:.4f}  params {result['parameters']:,}  steps {result['steps']}  train "
          f"{result['train_seconds']}s  curve " + " ".join(f"{p['val_loss']:.3f}" for p in result["curve"]),
          file=sys.stderr, flush=True)


def race_at_lr(spec: ModelSpec, settings: RaceSettings, data: Any, systems: list[str], lr: float,
               steps: int) -> dict[str, dict[str, Any]]:
    """Every system of ``systems`` but ``dense_time`` at peak ``lr`` for ``steps``, in ``SYSTEMS`` order."""
    from comera_lightning.rank import tt_layers

    results: dict[str, dict[str, Any]] = {}
    names: list[str] = []
    budget = 0
    for system in [s for s in SYSTEMS if s in systems and s != "dense_time"]:
        if system in ("dense", "galore"):
            result, _ = fit(system, spec, settings, data, lr=lr, steps=steps,
                            galore=settings.galore if system == "galore" else None)
        elif system == "comera":
            result, module = fit(system, spec, settings, data, lr=lr, steps=steps)
            names = [name for name, _ in tt_layers(module.model)]
            budget = result["tt_parameters"]
            result["tensorized_layers"] = names
        elif system == "narrow":
            width = narrow_width(spec, results["comera"]["parameters"], data.vocab_size, settings.block_size,
                                 settings.narrow_multiple)
            result, _ = fit(system, spec.with_width(width), settings, data, lr=lr, steps=steps)
        else:
            result, module = fit(system, spec, settings, data, lr=lr, steps=steps, low_rank=(names, budget))
            result.update(low_rank_rank=module.rank, low_rank_budget=budget)
        results[system] = result
        print_result(result)
    for result in results.values():
        sizes = result.pop("layer_sizes")
        tensorized = result["system"] == "comera"
        result["compressible_parameters"] = result["tt_parameters"] if tensorized else sum(sizes.get(n, 0) for n in names)
    return results
