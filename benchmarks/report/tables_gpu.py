"""Renderers of the device runs that have no table of their own (CUDA graphs per step, layers, the TT lookup)."""

from __future__ import annotations

from typing import Any


def strategy_speed(result: dict[str, Any]) -> str:
    """Step ms of the tensorized and dense paper Transformer, eager and captured, per batch."""
    config = result["config"]
    lines = [f"{config['layers']} encoders, {config['seq']} tokens, {config['optimizer']}, {config['steps']} timed steps.",
             "", "| batch | TT eager ms | TT graph ms | graph speedup | dense eager ms | dense graph ms | "
             "TT graph vs dense eager | vs dense graph |", "|---|---|---|---|---|---|---|---|"]
    for batch, run in result["cuda"].items():
        tt, dense = run["tensorized"], run["dense"]
        lines.append(f"| {batch} | {tt['step_ms']['eager']:.1f} | {tt['step_ms']['graph']:.1f} | "
                     f"{tt['graph_speedup']:.1f}× | {dense['step_ms']['eager']:.1f} | {dense['step_ms']['graph']:.1f} | "
                     f"{dense['step_ms']['eager'] / tt['step_ms']['graph']:.2f}× | "
                     f"{dense['step_ms']['graph'] / tt['step_ms']['graph']:.2f}× |")
    return "\n".join(lines)


def layer_speed(result: dict[str, Any]) -> str:
    """Forward + backward ms of one TT layer against the dense one, and the parameter ratio."""
    lines = [f"{result['tokens']:,} tokens, forward + backward, eager.", "",
             "| layer | dense ms | TT ms | TT speed × dense | parameters fewer |", "|---|---|---|---|---|"]
    for row in result["results"]:
        lines.append(f"| {row['layer']} | {row['dense_ms']:.2f} | {row['tt_ms']:.2f} | "
                     f"{row['dense_ms'] / row['tt_ms']:.2f}× | {row['param_ratio']:.1f}× |")
    return "\n".join(lines)


def tt_lookup(result: dict[str, Any]) -> str:
    """A large TT table's training and serving lookups against ``nn.Embedding``."""
    return "\n".join([
        f"TT table of {result['tt_params']:,} parameters against a dense one of {result['dense_params']:,}.", "",
        "| lookup | TT ms | dense ms |", "|---|---|---|",
        f"| training | {result['tt_train_dedup0_ms']:.2f} ({result['tt_train_dedup1_ms']:.2f} deduplicated) | "
        f"{result['dense_train_ms']:.2f} |",
        f"| serving | {result['tt_serve_ms']:.2f} | {result['dense_serve_ms']:.3f} |"])
