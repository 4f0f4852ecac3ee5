"""What CUDAGraphStrategy's mechanisms buy for the tensorized paper Transformer: one training step, side by side.

The model is the paper's encoder at its widths (d_model 768, d_ff 3072, 12 heads, learned
positions, TT embedding of BERT's 30,522 rows) with fewer layers, tensorized as
``configs/transformer.yaml`` does (linear ranks 30, embedding rank 32); one step is forward,
the early-stage objective ``L + 0.01·R``, backward and the optimizer step on a synthetic batch.

CUDA only: the step captured in a CUDA graph (the strategy's ``StepGraph`` with a capturable
optimizer, warmed up on a side stream) against the same step eagerly, for the tensorized and the
dense model, at batch 32 and 1. On CPU the strategy runs the default eager step, so there is
nothing to compare (the former ``torch.compile`` variant measured 1.32× slower than eager, with a
72 s first step, and was removed).

    python -m benchmarks.training.strategy_speed [--layers 2] [--seq 128] [--warmup 3] [--steps 10]
        [--optimizer adamw|came] [--out benchmarks/results/strategy_speed.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.probes import machine_basics
from comera_lightning import CAME, tensorize
from comera_lightning.models.transformer import SentencePairClassifier
from comera_lightning.rank import size_surrogate, tt_layers
from comera_lightning.strategy import StepGraph, make_capturable_

VOCAB = 30522


def build(layers: int, device: torch.device, tensorized: bool) -> SentencePairClassifier:
    """The paper's classifier with ``layers`` encoders; tensorized as configs/transformer.yaml does it."""
    torch.manual_seed(0)
    model = SentencePairClassifier(vocab_size=VOCAB, d_model=768, num_layers=layers, num_heads=12, d_ff=3072, max_positions=128)
    if tensorized:
        tensorize(model, max_rank=30, embedding_max_rank=32, num_cores=3, embedding_num_cores=4, include_attention=True, include_embeddings=True, min_compression=2.0)
    return model.to(device).train()


def make_batch(batch: int, seq: int, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(5, VOCAB, (batch, seq), generator=g).to(device),
        "attention_mask": torch.ones(batch, seq, dtype=torch.long, device=device),
        "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous().to(device),
        "labels": torch.randint(0, 3, (batch,), generator=g).to(device),
    }


def optimizer_for(model: torch.nn.Module, name: str, capturable: bool = False) -> torch.optim.Optimizer:
    if name == "came":
        optimizer = CAME(model.parameters(), lr=1e-4)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    if capturable:
        make_capturable_(optimizer)
    return optimizer


def step_fn(model: SentencePairClassifier, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> Callable[[], torch.Tensor]:
    """One training step on ``batch`` (read at call time, so a static batch works)."""
    layers = [m for _, m in tt_layers(model)]

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss = F.cross_entropy(logits, batch["labels"])
        if layers:
            loss = loss + 0.01 * size_surrogate(layers)
        loss.backward()
        optimizer.step()
        return loss

    return step


def timed(step: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def interleaved_ms(steps: dict[str, Callable[[], object]], args: argparse.Namespace, device: torch.device) -> dict[str, list[float]]:
    """Warm every step up, then time them in turn ``args.steps`` times, the order rotated each round; milliseconds per name."""
    for _ in range(args.warmup):
        for step in steps.values():
            step()
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(args.steps):
        for name in names[i % len(names):] + names[: i % len(names)]:
            times[name].append(1e3 * timed(steps[name], device))
    return times


def cuda_graphs(args: argparse.Namespace, batch_size: int) -> dict:
    """Graph vs eager, tensorized and dense, at one batch size (CUDA only)."""
    device = torch.device("cuda")
    batch = make_batch(batch_size, args.seq, device)
    rows = {}
    for kind, tensorized in (("tensorized", True), ("dense", False)):
        model = build(args.layers, device, tensorized)
        eager = step_fn(model, optimizer_for(model, args.optimizer), batch)
        graph_model = copy.deepcopy(model)
        graph_optimizer = optimizer_for(graph_model, args.optimizer, capturable=True)
        entry = StepGraph(batch)
        captured = step_fn(graph_model, graph_optimizer, entry.static_batch)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(args.warmup):
                captured()
        torch.cuda.current_stream(device).wait_stream(side)
        graph_optimizer.zero_grad(set_to_none=True)
        entry.capture(captured)

        def replay() -> None:
            entry.load(batch)
            entry.replay()

        times = interleaved_ms({"eager": eager, "graph": replay}, args, device)
        ms = {k: statistics.median(v) for k, v in times.items()}
        rows[kind] = {"step_ms": ms, "graph_speedup": ms["eager"] / ms["graph"]}
    rows["tensorized_graph_vs_dense_eager"] = rows["dense"]["step_ms"]["eager"] / rows["tensorized"]["step_ms"]["graph"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--optimizer", choices=["adamw", "came"], default="adamw")
    parser.add_argument("--out", default="benchmarks/results/strategy_speed.json")
    args = parser.parse_args()
    result: dict = {
        "config": vars(args),
        "machine": {
            **machine_basics(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
    }
    lines = [f"Tensorized paper Transformer, {args.layers} layers, sequence {args.seq}, {args.optimizer}"]
    if torch.cuda.is_available():
        result["cuda"] = {str(b): cuda_graphs(args, b) for b in (32, 1)}
        for b, rows in result["cuda"].items():
            for kind in ("tensorized", "dense"):
                ms = rows[kind]["step_ms"]
                lines.append(f"CUDA batch {b:>2} {kind:10s} eager {ms['eager']:7.2f} ms   graph {ms['graph']:7.2f} ms   "
                             f"graph speedup {rows[kind]['graph_speedup']:.2f}x")
            lines.append(f"CUDA batch {b:>2} tensorized+graph vs dense eager: {rows['tensorized_graph_vs_dense_eager']:.2f}x faster")
    else:
        lines.append("CUDA: no device here, the graph comparison did not run.")
    print("\n".join(lines))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
