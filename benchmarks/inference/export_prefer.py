"""``export(prefer="size")`` against ``prefer="speed"``: the bytes and the latency of both programs, side by side (issue 45).

Workloads:

* ``llama``: a small Hugging Face ``LlamaForCausalLM`` (vocabulary 3,000, width 128, MLP 256, 2 layers, random
  init), its token table and every linear layer (attention included) tensorized at rank 16, then
  ``--train-steps`` Adam steps on Zipf(1.2) token ids (which also count the ids for the hot rows) and half of
  every bond pruned; timed at 1 x 32 and 8 x 128 tokens;
* ``dlrm``: TorchRec's DLRM (``embedding_systems.build_dlrm``) on the 26 Criteo tables capped at 200,000 rows
  (1.48M rows, dim 16, Zipf(1.2) ids: ``embedding_workloads``; ``--quick``: 5,000 rows), TT tables at rank 16
  (``min_rows=1000``), a third of every bond kept and pruned, ids counted from ``--count-batches`` batches of 4,096
  (the 8 tables over 65,536 rows, which the default 4 MiB cache does not hold whole); timed at batch 1 and 4,096.

Systems, each a program written with ``torch.export.save`` and loaded back with ``torch.export.load``:
``dense`` (the model before tensorizing, through the same ``export``), ``size`` (the default), ``speed``, and for
the DLRM ``size_hot`` (``prefer="size", hot_rows=HOT_ROW_BYTES``: a cache the user asked for; the Llama's token
table counts no ids, its default cache holding it whole, so it has no hot rows to keep). Bytes: the program's
tensors (``ExportReport.program_bytes``) and the file. Latency: interleaved rounds (``embedding_timing.interleave``),
``torch.inference_mode``; (N×) = the median of each round's own dense / system ratio, ``speed_over_size`` the
median of each round's size / speed.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.inference.export_prefer [--workloads llama,dlrm] [--rounds 21]
        [--warmup 2] [--quick] [--out benchmarks/results/export_prefer.json]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.inference.embedding_timing import calls_per_round, interleave
from benchmarks.probes import RESULTS, command_line, machine_basics

WORKLOADS = ("llama", "dlrm")
HOT_ROW_BYTES = 256 * 1024  # per table: 4,096 rows of dim 16 (speed: the tables' 4 MiB cache_rows)
DLRM_MAX_ROWS = 200_000
BATCHES = {"llama": ((1, 32), (8, 128)), "dlrm": ((1, 1), (4096, 1))}  # (batch, tokens) / (batch, ids per feature)
VOCAB, WIDTH, RANK = 3000, 128, 16
QUICK = {"rounds": 2, "warmup": 1, "train_steps": 2, "count_batches": 1}


def log(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def zipf_tokens(generator: Any, shape: tuple[int, ...], vocab: int) -> Any:
    """Token ids drawn from Zipf(1.2) over a fixed random order of the vocabulary (the hot ids are scattered)."""
    import torch

    weights = torch.arange(1, vocab + 1, dtype=torch.float64) ** -1.2
    order = torch.randperm(vocab, generator=torch.Generator().manual_seed(7))
    return order[torch.multinomial(weights, int(torch.tensor(shape).prod()), replacement=True, generator=generator)].view(shape)


def prune_half_(model: Any, keep: float = 0.5) -> None:
    """A simulated late stage: the trailing ``1 - keep`` of every bond's gates zeroed, then pruned."""
    import torch

    from comera_lightning.rank import prune_, tt_layers

    with torch.no_grad():
        for _, layer in tt_layers(model):
            for gate in layer.gates:
                gate[max(1, int(gate.numel() * keep)):] = 0.0
    prune_(model)


def build_llama(args: argparse.Namespace) -> tuple[Any, Any]:
    """(dense, tensorized-trained-pruned) Llamas in eval mode, the same initial weights."""
    import torch
    import torch.nn.functional as F
    import transformers

    from comera_lightning import tensorize

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, use_cache=False)
    dense = transformers.LlamaForCausalLM(config).eval()
    model = copy.deepcopy(dense)
    tensorize(model, max_rank=RANK, embedding_max_rank=RANK, include_attention=True, min_compression=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    model.train()
    for _ in range(args.train_steps):  # training-mode forwards also count the token ids (the hot rows)
        ids = zipf_tokens(generator, (16, 64), VOCAB)
        F.cross_entropy(model(ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    prune_half_(model)
    return dense, model.eval()


def criteo(args: argparse.Namespace) -> Any:
    from benchmarks.inference.embedding_workloads import make_workload

    return make_workload("criteo", quick=args.quick, max_rows=DLRM_MAX_ROWS)


def llama_inputs(args: argparse.Namespace, batch: int, tokens: int, count: int) -> list[tuple[Any, ...]]:
    import torch

    generator = torch.Generator().manual_seed(batch * 1000 + tokens)
    return [(zipf_tokens(generator, (batch, tokens), VOCAB),) for _ in range(count)]


def build_dlrm(args: argparse.Namespace) -> tuple[Any, Any]:
    """(dense, TT-pruned-counted) DLRMs on the quick Criteo tables, the same MLPs."""
    import torch
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from benchmarks.inference.embedding_systems import build_dlrm as dlrm_around, tt_collection

    workload = criteo(args)
    torch.manual_seed(0)
    dense = dlrm_around(EmbeddingBagCollection(tables=workload.configs(16)), 16, workload.num_dense).eval()
    collection = tt_collection("tt", workload.configs(16), RANK, 1000)
    prune_half_(collection, keep=1 / 3)
    for batch in workload.batches(4096, args.count_batches, seed=5, split="train"):
        collection.count_ids(batch.sparse)
    return dense, dlrm_around(collection, 16, workload.num_dense).eval()


def dlrm_inputs(args: argparse.Namespace, batch: int, _: int, count: int) -> list[tuple[Any, ...]]:
    from comera_lightning.export.dlrm import kjt_to_ids

    workload = criteo(args)
    return [(b.dense, kjt_to_ids(b.sparse, workload.feature_names)) for b in workload.batches(batch, count, seed=batch)]


def export_options(workload: str) -> dict[str, dict[str, Any]]:
    """``export``'s options for each system (``dense`` exports the dense model with the defaults)."""
    hot = {"size_hot": {"prefer": "size", "hot_rows": HOT_ROW_BYTES}} if workload == "dlrm" else {}
    return {"dense": {}, "size": {"prefer": "size"}, **hot, "speed": {"prefer": "speed"}}


def export_all(workload: str, dense: Any, model: Any, example: tuple, folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every system's program, loaded back from its file, and its sizes and per-layer forms."""
    import torch

    from comera_lightning.export import export_with_report

    programs, sizes = {}, {}
    for system, options in export_options(workload).items():
        path = folder / f"{workload}_{system}.pt2"
        _, report = export_with_report(dense if system == "dense" else model, example, path, **options)
        log(f"{workload} {system}: {report.program_bytes / 1e6:.3f} MB of tensors, file {path.stat().st_size / 1e6:.3f} MB")
        programs[system] = torch.export.load(str(path)).module()
        forms = {}
        for layer in report.layers:
            forms[layer.form] = forms.get(layer.form, 0) + 1
        sizes[system] = {"program_bytes": report.program_bytes, "file_bytes": path.stat().st_size, "forms": forms,
                         "parameter_bytes": report.parameter_bytes}
    return programs, sizes


def example_and_expected(workload: str, model: Any, args: argparse.Namespace) -> tuple[tuple, Any]:
    """A batch of 2 as the programs take it, and the eager TT model's output on it."""
    import torch

    from comera_lightning.export.dlrm import kjt_to_ids

    with torch.no_grad():
        if workload == "llama":
            example = llama_inputs(args, 2, 16, 1)[0]
            return example, model(*example).logits
        batch = criteo(args).batches(2, 1, seed=3)[0]
        example = (batch.dense, kjt_to_ids(batch.sparse, criteo(args).feature_names))
        return example, model(dense_features=batch.dense, sparse_features=batch.sparse).squeeze(-1)


def max_errors(programs: dict[str, Any], example: tuple, expected: Any) -> dict[str, float]:
    """Largest absolute difference of each TT program's output from the eager TT model's."""
    import torch

    with torch.no_grad():
        outputs = {system: program(*example) for system, program in programs.items() if system != "dense"}
    return {system: float((getattr(out, "logits", out) - expected).abs().max()) for system, out in outputs.items()}


def time_programs(workload: str, programs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved rounds of every program at each batch shape; the paired ratios."""
    import torch

    make_inputs = llama_inputs if workload == "llama" else dlrm_inputs
    timings = {}
    for batch, length in BATCHES[workload]:
        per_round = calls_per_round(batch)  # 32 calls a round at batch 1
        inputs = make_inputs(args, batch, length, per_round * (args.rounds + args.warmup))
        calls = {name: (lambda i, p=program: p(*inputs[i])) for name, program in programs.items()}
        with torch.inference_mode():
            result = interleave(calls, args.rounds, args.warmup, per_round)
        rounds = result["ms_rounds"]
        result["speed_over_size"] = statistics.median(s / f for s, f in zip(rounds["size"], rounds["speed"]))
        timings[f"{batch}x{length}"] = result
        log(f"{workload} {batch}x{length}: ms " + ", ".join(f"{k} {v:.3f}" for k, v in result["ms_median"].items()))
    return timings


def run_workload(workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """One workload's models, programs, sizes, output errors and timings."""
    dense, model = build_llama(args) if workload == "llama" else build_dlrm(args)
    example, expected = example_and_expected(workload, model, args)
    with tempfile.TemporaryDirectory(prefix="comera_prefer_") as folder:
        programs, sizes = export_all(workload, dense, model, example, Path(folder))
    return {"sizes": sizes, "max_abs_error": max_errors(programs, example, expected), "timing": time_programs(workload, programs, args)}


def markdown(results: dict[str, Any]) -> str:
    """One table per workload: bytes, file and latency of every system, (dense / system) beside each."""
    lines = []
    for workload, result in results["workloads"].items():
        shapes = list(result["timing"])
        lines += [f"**{workload}**", "", "| system | tensors MB | file MB | " + " | ".join(f"{s} ms" for s in shapes) + " |",
                  "|---" * (3 + len(shapes)) + "|"]
        for system in result["sizes"]:
            size = result["sizes"][system]
            cells = [f"{size['program_bytes'] / 1e6:.3f}", f"{size['file_bytes'] / 1e6:.3f}"]
            for shape in shapes:
                timing = result["timing"][shape]
                ratio = timing.get("dense_over_paired", {}).get(system, 1.0)
                cells.append(f"{timing['ms_median'][system]:.3f} ({ratio:.2f}x)")
            lines.append(f"| {system} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("speed / size (paired): " + ", ".join(f"{s} {result['timing'][s]['speed_over_size']:.2f}x" for s in shapes))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--count-batches", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="few rounds and steps: a smoke run")
    parser.add_argument("--out", default=str(RESULTS / "export_prefer.json"))
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    import torch

    torch.set_num_threads(args.threads)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {WORKLOADS}.")
    results = {"command": command_line(argv), "machine": machine_basics(), "torch": torch.__version__,
               "date": datetime.date.today().isoformat(), "settings": vars(args), "workloads": {}}
    for workload in workloads:
        log(f"{workload} ...")
        results["workloads"][workload] = run_workload(workload, args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
