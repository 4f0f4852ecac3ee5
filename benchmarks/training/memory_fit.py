"""The largest LLaMA-shaped model whose training step fits a GPU's memory, dense against CoMERA. Modeled, not measured.

For each shape (LLaMA 1B, 3B, 7B, 13B, 30B, 65B; a 32,000-token vocabulary) and system (dense; CoMERA's default 4x
budget and an 8x one, at the start of training: ranks only shrink after), the memory floor of one AdamW step at batch
1 x 2,048 tokens in bf16-mixed:

* state: fp32 parameters, their gradients and AdamW's two moments, 16 bytes a parameter, the parameters counted
  exactly on the meta device after ``tensorize`` at the callback's start caps (``BudgetConfig.start_caps``);
* activations: the bytes autograd saves per token, ``blocks x (a·width + b·FFN) + c·vocabulary``, the three
  coefficients of each system solved from the step account's rows at three counted shapes (``step_account.py
  --precision bf16-mixed``: LLaMA-60M, -350M and -1B; CoMERA 8x takes the 4x coefficients: its layers save the same).

The sum is a floor: a GPU's allocator adds its largest op's transients and fragmentation.

    python -m benchmarks.training.memory_fit --account benchmarks/results/step_account.json [--tokens 2048] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.probes import today, write_result
from benchmarks.quality.models import ModelSpec, build_lm
from benchmarks.training.gpu_runs import WORKLOADS

#: LLaMA's shapes: (width, blocks, FFN).
SHAPES = {"1b": (2048, 24, 5461), "3b": (3200, 26, 8640), "7b": (4096, 32, 11008), "13b": (5120, 40, 13824),
          "30b": (6656, 60, 17920), "65b": (8192, 80, 22016)}
SYSTEMS = {"dense": None, "comera-4x": 4.0, "comera-8x": 8.0}
BUDGETS_GIB = (24, 48, 80)
VOCABULARY = 32000
STATE_BYTES = 16  # fp32 weight, gradient, AdamW's exp_avg and exp_avg_sq


def parameters(shape: tuple[int, int, int], compression: float | None) -> int:
    """Parameters of the shape's random-init Llama, dense or tensorized at the callback's start for ``compression``."""
    from comera_lightning import BudgetConfig, TensorizeConfig, tensorize

    width, blocks, ffn = shape
    with torch.device("meta"):
        model = build_lm(ModelSpec("llama", width, blocks, ffn), VOCABULARY, 2048)
        if compression is not None:
            tensorize(model, BudgetConfig(compression=compression).start_caps(model, TensorizeConfig()))
        return sum(p.numel() for p in model.parameters())


def activation_coefficients(rows: list[dict[str, Any]], system: str) -> np.ndarray:
    """(a, b, c) of ``saved bytes per token = blocks·(a·width + b·FFN) + c·vocabulary`` from the account's Llama rows."""
    counted = [r for r in rows if r["system"] == system and r["model"] in WORKLOADS and WORKLOADS[r["model"]].kind == "llama"]
    if len(counted) < 3:
        raise SystemExit(f"memory_fit: the account has {len(counted)} Llama rows of {system}; three shapes are needed")
    x = np.array([[WORKLOADS[r["model"]].layers * WORKLOADS[r["model"]].width, WORKLOADS[r["model"]].layers * WORKLOADS[r["model"]].ffn,
                   WORKLOADS[r["model"]].vocab] for r in counted], dtype=float)
    per_token = np.array([r["saved_bytes"] / (r["batch"] * r["seq"]) for r in counted])
    return np.linalg.lstsq(x, per_token, rcond=None)[0]


def table(rows: list[dict[str, Any]], tokens: int) -> list[dict[str, Any]]:
    """GiB of every shape and system: state, activations, their sum."""
    coefficients = {"dense": activation_coefficients(rows, "dense"), "comera": activation_coefficients(rows, "comera")}
    out = []
    for name, shape in SHAPES.items():
        width, blocks, ffn = shape
        for system, compression in SYSTEMS.items():
            a, b, c = coefficients["dense" if compression is None else "comera"]
            count = parameters(shape, compression)
            activations = tokens * (blocks * (a * width + b * ffn) + c * VOCABULARY)
            out.append({"shape": name, "system": system, "parameters": count, "state_gib": count * STATE_BYTES / 2**30,
                        "activation_gib": activations / 2**30, "floor_gib": (count * STATE_BYTES + activations) / 2**30})
    return out


def largest(rows: list[dict[str, Any]]) -> dict[str, dict[str, str | None]]:
    """Per budget and system: the largest shape whose floor fits."""
    order = list(SHAPES)
    fits: dict[str, dict[str, str | None]] = {}
    for budget in BUDGETS_GIB:
        fits[f"{budget} GiB"] = {}
        for system in SYSTEMS:
            inside = [r["shape"] for r in rows if r["system"] == system and r["floor_gib"] <= budget]
            fits[f"{budget} GiB"][system] = max(inside, key=order.index) if inside else None
    return fits


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Training-step memory floor, AdamW, batch 1 x {result['tokens']:,} tokens, bf16-mixed: **modeled** from "
             f"{', '.join(f'`{p}`' for p in result['account'])} (state counted on the meta device; activations fitted on the "
             "account's rows).", "",
             "| shape | system | parameters | state GiB | activations GiB | floor GiB |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['shape']} | {r['system']} | {r['parameters'] / 1e9:.2f} B | {r['state_gib']:.1f} | {r['activation_gib']:.1f} | "
              f"{r['floor_gib']:.1f} |" for r in result["rows"]]
    lines += ["", "| memory | " + " | ".join(SYSTEMS) + " |", "|---" * (len(SYSTEMS) + 1) + "|"]
    lines += [f"| {budget} | " + " | ".join(fit or "none" for fit in fits.values()) + " |" for budget, fits in result["largest"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--account", nargs="+", required=True, help="step_account.py's JSONs (bf16-mixed, Llama rows at three shapes)")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = table([r for path in args.account for r in json.loads(Path(path).read_text())["rows"]], args.tokens)
    result = {"date": today(), "account": args.account, "tokens": args.tokens, "rows": rows, "largest": largest(rows)}
    write_result(args.out, result, markdown(result))
    return result


if __name__ == "__main__":
    main()
