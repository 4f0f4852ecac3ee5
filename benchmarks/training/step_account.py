"""The step account: what one training step asks of a device, dense and CoMERA side by side, counted on CPU.

For each GPU workload (``gpu_runs.py``'s LLaMA-60M, -130M, -350M and -1B shapes; the paper's Transformer with the
callback's defaults and in the paper's layout) a real ``Trainer.fit`` runs dense and with ``ComeraCallback`` (early
stage: every rank alive, its slowest step), and ``op_tally.OpTally`` counts steps ``--warmup`` to ``--warmup +
--steps`` (from the start of the first to the start of the one after the last, divided by the count): kernels per step
by phase (forward, backward, optimizer, the callback's own work: its objective, the optimizer's step hooks, its batch
end; the loop between batches), host syncs, GEMM FLOPs (and the share of them a GPU must run with its slow kernels
for operands not in 16-byte rows: ``op_tally.rows_aligned``), bytes read and written by the other kernels, bytes
autograd saves for backward (parameters excluded), and parameter + gradient + optimizer-state bytes after the step. Every
optimizer runs multi-tensor (``foreach``), as it does on a GPU by default. The ratios are CoMERA over dense.

Shapes: the workloads' widths, depths, vocabularies and sequence lengths (``--seq`` to change it), at ``--batch``
samples (default 1); ``--at-batch N`` counts at batches 1 and 2 and extends every figure linearly to N (exact: at a
fixed sequence length each op's work is affine in the batch; kernels and state do not depend on it). Kernels are taken from
batch 2 (a Hugging Face model dispatches a few more ops at batch 1). A model whose dense training state would not fit
this host (LLaMA-1B: 21 GB) is counted at 2 and 4 blocks and extended linearly to its depth (its blocks are alike;
ranks as the callback chooses at those depths). Each row says how it was counted. ``--precision bf16-mixed`` counts
the casts autocast adds (as the GPU runs do). The memory floor: state plus saved activations (``add_floor``); a
GPU's peak adds the largest op's transients (``gpu_speed.py`` measures it). Systems: ``dense``, ``comera`` (the
defaults' early stage, at twice the 4x budget's end size), ``comera-end`` (the 4x budget's end size, the compute of
the late stage's end), ``comera-paper`` (the Transformer in the paper's layout).
Token tables are counted as a GPU looks them up at the workloads' batch of 32: through the whole table (one GEMM and a
dense embedding's lookup, ``comera_lightning/layers/kernels/full_table.py``); ``--lookups torch`` counts the torch path a
CPU runs (as every account before 2026-11-30's cut did). ``--check``: tiny shapes (the tests run it).

    python -m benchmarks.training.step_account [--models llama60m,transformer] [--systems dense,comera,comera-paper]
        [--batch 1] [--at-batch N] [--seq S] [--precision 32-true] [--warmup 2] [--steps 2] [--lookups torch] [--check]
        [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from benchmarks.probes import RESULTS, command_line, environment, machine_basics, write_result
from benchmarks.training.gpu_runs import (CHECK_WORKLOADS, SYSTEMS, WORKLOADS, SyntheticTokens, Workload, build_module,
                                          system_callbacks)
from benchmarks.training.op_tally import PHASES, OpTally, PhaseCount, PhaseMarks

#: How token tables are counted: as a GPU looks them up at the workloads' batch of 32 (``kernels/full_table.py``), or
#: through the torch path a CPU runs (how every account before 2026-11-30's lookup cut counted them).
LOOKUP_ROUTES = ("whole-table", "torch")
#: gpu_speed's systems and the default budget at its end size.
ACCOUNT_SYSTEMS = {kind: (*systems, "comera-end") for kind, systems in SYSTEMS.items()}
#: Dense training state (fp32 weights, gradients, AdamW's two moments) above this is counted at two depths, extended.
DIRECT_STATE_LIMIT = 12 * 2**30
EXTEND_DEPTHS = (2, 4)


class ForeachOptimizers(L.Callback):
    """Every optimizer multi-tensor, as torch chooses on a GPU (on CPU its default is one kernel chain per parameter):
    the module's and the rank gates' own Adam."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for optimizer in _all_optimizers(trainer, trainer.callbacks):
            if "foreach" in optimizer.defaults:
                for group in optimizer.param_groups:
                    group["foreach"] = True


def state_bytes(module: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict[str, int]:
    """Bytes of the parameters, their gradients and the optimizers' state (the gates' own Adam included)."""
    params = list(module.parameters())
    state = [t for opt in optimizers for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    size = lambda tensors: sum(t.numel() * t.element_size() for t in tensors)  # noqa: E731
    return {"parameter_bytes": size(params), "gradient_bytes": size(p.grad for p in params if p.grad is not None),
            "optimizer_state_bytes": size(state)}


def _all_optimizers(trainer: L.Trainer, callbacks: list[L.Callback]) -> list[torch.optim.Optimizer]:
    gates = [opt for cb in callbacks for opt in getattr(getattr(cb, "gate_optimizer", None), "optimizers", lambda: [])()]
    return [*trainer.optimizers, *gates]


def count_run(workload: Workload, system: str, args: argparse.Namespace) -> dict[str, Any]:
    """One system's account at ``workload``'s shape: a fit of ``warmup + steps + 1`` steps, steps ``warmup..`` counted."""
    tally = OpTally()
    first, last = PhaseMarks(tally, args.warmup, args.steps), PhaseMarks(tally, args.warmup, args.steps, at_end=True)
    system_cbs = system_callbacks(system, args.check)
    total = args.warmup + args.steps + 1
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=total, precision=args.precision,
                        callbacks=[first, *system_cbs, last, ForeachOptimizers()], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0)
    module = build_module(workload)
    data = DataLoader(SyntheticTokens(workload, workload.batch * total), batch_size=workload.batch)
    with tally:
        trainer.fit(module, data)
    gc.collect()  # the layers, their gate bank and halves group refer to each other: free one run's model before the next
    overall = PhaseCount()
    for count in tally.counts.values():
        overall.add(count)
    per_step = lambda value: value / args.steps  # noqa: E731
    return {"model": workload.name, "system": system, "counted": f"direct, batch {workload.batch} x {workload.seq}",
            "batch": workload.batch, "seq": workload.seq, "layers": workload.layers,
            "kernels": per_step(overall.kernels), "syncs": per_step(overall.syncs),
            "gemm_flops": per_step(overall.gemm_flops), "misaligned_gemm_flops": per_step(overall.misaligned_gemm_flops),
            "other_bytes": per_step(overall.other_bytes),
            "kernels_by_phase": {phase: per_step(tally.counts[phase].kernels) for phase in PHASES},
            "top_ops": {phase: {name: per_step(n) for name, n in tally.counts[phase].ops.most_common(40)} for phase in PHASES},
            "saved_bytes": first.saved.total, "parameters": sum(p.numel() for p in module.parameters()),
            **state_bytes(module, _all_optimizers(trainer, system_cbs))}


def add_floor(row: dict[str, Any]) -> None:
    """``floor_bytes``: parameters, gradients, optimizer state and the activations saved for backward, all alive at the
    end of a forward: what a step needs at least (a GPU's peak adds the transients of the largest op)."""
    row["floor_bytes"] = row["parameter_bytes"] + row["gradient_bytes"] + row["optimizer_state_bytes"] + row["saved_bytes"]


#: What a batch does not change (HF models dispatch a few extra ops at batch 1): taken from the larger batch's count.
PER_STEP_KEYS = ("kernels", "syncs", "kernels_by_phase", "top_ops")


def extended(a: Any, b: Any, xa: float, xb: float, x: float, keep: tuple[str, ...] = ()) -> Any:
    """Each number of ``a`` (counted at ``xa``) and ``b`` (at ``xb``) extended on their line to ``x``; other values,
    and those under ``keep``, from ``b``."""
    if isinstance(a, dict):
        return {key: value if key in keep else extended(a.get(key, 0), value, xa, xb, x) for key, value in b.items()}
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return a + (b - a) * (x - xa) / (xb - xa)
    return b


def account_row(workload: Workload, system: str, args: argparse.Namespace) -> dict[str, Any]:
    """The row at the workload's depth and ``--at-batch`` (else ``--batch``): counted directly, or extended (see the module)."""
    batch = args.at_batch or args.batch

    def at_depth(layers: int) -> dict[str, Any]:
        shaped = replace(workload, layers=layers)
        if not args.at_batch:
            return count_run(replace(shaped, batch=args.batch), system, args)
        one, two = (count_run(replace(shaped, batch=b), system, args) for b in (1, 2))
        return extended(one, two, 1, 2, batch, keep=PER_STEP_KEYS)

    dense_state = 16 * _dense_parameters(workload)
    if args.check or dense_state <= DIRECT_STATE_LIMIT:
        row = at_depth(workload.layers)
        how = row["counted"] if not args.at_batch else f"batches 1 and 2 x {workload.seq}, extended to {batch}"
    else:
        low, high = EXTEND_DEPTHS
        row = extended(at_depth(low), at_depth(high), low, high, workload.layers)
        how = f"{low} and {high} blocks, extended to {workload.layers}; batch {batch} x {workload.seq}"
    row = {**row, "counted": how, "batch": batch, "layers": workload.layers}
    add_floor(row)
    return row


def _dense_parameters(workload: Workload) -> int:
    """The dense model's parameters, counted on the meta device."""
    with torch.device("meta"):
        module = build_module(workload)
        module.configure_model()
        return sum(p.numel() for p in module.parameters())


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """CoMERA over dense of the same workload: kernels, GEMM FLOPs, other bytes, saved bytes, state bytes, the memory floor."""
    dense = {r["model"]: r for r in rows if r["system"] == "dense"}
    keys = ("kernels", "gemm_flops", "other_bytes", "saved_bytes", "parameter_bytes", "optimizer_state_bytes", "floor_bytes")
    for row in rows:
        base = dense.get(row["model"])
        row["x_dense"] = {k: row[k] / base[k] if base and base.get(k) and row.get(k) is not None else None for k in keys}


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _share(row: dict[str, Any]) -> str:
    """The GEMM FLOPs on rows a GPU cannot read 16 bytes at a time, as a share (accounts before 2026-11-30 have none)."""
    return "-" if row.get("misaligned_gemm_flops") is None else f"{row['misaligned_gemm_flops'] / row['gemm_flops']:.0%}"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def _route(result: dict[str, Any]) -> str:
    route = result["config"].get("lookups", "torch")  # (older accounts counted the torch path)
    return "through the whole table" if route == "whole-table" else "by the torch path"


def markdown(result: dict[str, Any]) -> str:
    """The account as a markdown table naming the host and what was counted."""
    lines = [f"Step account on **{result['machine']['cpu']}** (counted on CPU, torch {result['machine']['torch']}, "
             f"{result['config']['precision']}, token tables {_route(result)}, {result['date']}): `{result['command']}`", "",
             "| model | system | kernels/step | fwd | bwd | opt | callback | loop | × dense kernels | GEMM GFLOP | "
             "× dense FLOPs | of them misaligned | saved MiB | × dense saved | state MiB | floor MiB | × dense floor | counted |",
             "|" + "---|" * 18]
    for r in result["rows"]:
        phases, x = r["kernels_by_phase"], r["x_dense"]
        state = r["parameter_bytes"] + r["gradient_bytes"] + r["optimizer_state_bytes"]
        lines.append(
            f"| {r['model']} | {r['system']} | {r['kernels']:,.0f} | " + " | ".join(f"{phases[p]:,.0f}" for p in PHASES)
            + f" | {_ratio(x['kernels'])} | {r['gemm_flops'] / 1e9:,.2f} | {_ratio(x['gemm_flops'])} | {_share(r)} | "
            f"{_mib(r['saved_bytes'])} | {_ratio(x['saved_bytes'])} | {_mib(state)} | {_mib(r.get('floor_bytes'))} | "
            f"{_ratio(x.get('floor_bytes'))} | {r['counted']} |")  # accounts before the floor column have none
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama60m,transformer")
    parser.add_argument("--systems", default="dense,comera,comera-end,comera-paper")
    parser.add_argument("--batch", type=int, default=1, help="samples per counted step")
    parser.add_argument("--at-batch", type=int, default=None, help="count at batches 1 and 2, extend to this one")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sample (default: the workload's)")
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--warmup", type=int, default=2, help="steps before the counted ones")
    parser.add_argument("--steps", type=int, default=2, help="steps counted (the figures are per step)")
    parser.add_argument("--lookups", default="whole-table", choices=LOOKUP_ROUTES,
                        help="token tables counted through the whole table (a GPU's route at batch 32) or the torch path")
    parser.add_argument("--check", action="store_true", help="tiny shapes")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    known = CHECK_WORKLOADS if args.check else WORKLOADS
    args.models = [m for m in args.models.split(",") if m]
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = [m for m in args.models if m not in known] + [s for s in args.systems if s not in ACCOUNT_SYSTEMS["transformer"]]
    if unknown or not args.models or not args.systems:
        parser.error(f"unknown {unknown}; models: {list(known)}; systems: {list(ACCOUNT_SYSTEMS['transformer'])}")
    return args


def plan(args: argparse.Namespace) -> list[tuple[Workload, str]]:
    """(workload at the account's sequence length, system) for every system the workload's kind has."""
    known = CHECK_WORKLOADS if args.check else WORKLOADS
    shaped = {name: replace(w, seq=args.seq or w.seq) for name, w in known.items()}
    return [(shaped[m], s) for m in args.models for s in args.systems if s in ACCOUNT_SYSTEMS[shaped[m].kind]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    rows = []
    with environment(COMERA_WHOLE_TABLE="1" if args.lookups == "whole-table" else "0"):
        for workload, system in plan(args):
            print(f"  {workload.name} {system} ...", file=sys.stderr, flush=True)
            rows.append(account_row(workload, system, args))
    add_ratios(rows)
    result = {"command": command_line(argv), "date": datetime.date.today().isoformat(), "config": vars(args),
              "machine": {**machine_basics(), "torch": torch.__version__}, "rows": rows}
    out = Path(args.out) if args.out else RESULTS / ("step_account_check.json" if args.check else "step_account.json")
    write_result(out, result, markdown(result))
    return result


if __name__ == "__main__":
    main()
