"""The encoder's CPU dropout vs torch's ``F.dropout``: the paper Transformer's training step, both ways.

Builds ``dense`` and ``comera`` (early stage) exactly as ``transformer_speed.py`` does, twice each:
once as the package builds them (``comera_lightning.models.dropout``: 16-bit random words, a bool
mask, one fused multiply; the attention probabilities through SDPA's math path with that mask) and
once with torch's dropout put back (``nn.Dropout`` modules, ``F.scaled_dot_product_attention(...,
dropout_p=p)``). The four systems take one step each in turn, the order rotated every round, on the
same batches; medians after one warm-up step.

    .venv/bin/python -m benchmarks.training.dropout_speed [--batch 32] [--steps 6] [--threads 2]
        [--out benchmarks/results/dropout_speed.json]

About 2.5 minutes at batch 32 on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.probes import command_line, machine_basics
from benchmarks.training import transformer_speed


def with_torch_dropout(system: Any) -> Any:
    """Put torch's dropout back into ``system.model``: ``nn.Dropout`` modules and SDPA's own dropout."""
    import torch.nn.functional as F
    from torch import nn

    from comera_lightning.models.dropout import Dropout
    from comera_lightning.models.encoder import SelfAttention

    for module in list(system.model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Dropout):
                setattr(module, name, nn.Dropout(child.p))
        if isinstance(module, SelfAttention):
            p = module.dropout_p
            module._attend_with_cpu_dropout = lambda q, k, v, mask, p=p: F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p)
    return system


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved medians of the four systems, and the ratios."""
    import torch

    torch.set_num_threads(args.threads)
    model_args = transformer_speed.parse_args(["--threads", str(args.threads)])
    systems = {}
    for name in ("dense", "comera"):
        systems[f"{name}/package"] = transformer_speed.System(name, model_args)
        systems[f"{name}/torch"] = with_torch_dropout(transformer_speed.System(name, model_args))
    names = list(systems)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i, batch in enumerate(transformer_speed.make_batches(args.batch, 1 + args.steps, model_args)):
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            systems[name].step(batch)
            if i:
                times[name].append(1e3 * (time.perf_counter() - start))
    median = {name: statistics.median(t) for name, t in times.items()}
    ratios = {
        "dense_over_comera_torch_dropout": median["dense/torch"] / median["comera/torch"],
        "dense_over_comera_package_dropout": median["dense/package"] / median["comera/package"],
        "comera_torch_over_package": median["comera/torch"] / median["comera/package"],
        "dense_torch_over_package": median["dense/torch"] / median["dense/package"],
    }
    return {"step_ms_median": median, "step_ms_all": times, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/dropout_speed.json"))
    args = parser.parse_args()
    result = run(args)
    print(f"paper Transformer step, batch {args.batch} x 128, {args.threads} threads, median of {args.steps} (ms):")
    for name, ms in result["step_ms_median"].items():
        print(f"  {name:16s} {ms:8.0f}")
    for name, ratio in result["ratios"].items():
        print(f"  {name:36s} {ratio:6.2f}x")
    import torch

    payload = {"benchmark": "dropout_speed", "command": command_line(), "settings": vars(args),
               "machine": {**machine_basics(), "torch": torch.__version__}, **result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
