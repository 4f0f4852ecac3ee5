r"""The quality race: causal-LM pre-training with CoMERA against what a user would do instead.

Random-init Hugging Face causal LMs (Llama- and GPT-2-style) learn next-token prediction on the
package's code corpus (the Python standard library, byte-level BPE) inside one plain
LightningModule (``lm.py``) with one AdamW and a warm-up + cosine schedule. Per model, in one
process, same data, seed and steps, in this order:

* ``dense``: the model as configured;
* ``comera``: the same module with ``ComeraCallback()`` and its defaults (plus ``--comera key=value``);
* ``narrow``: a dense model of the same family whose width (a multiple of 16, ``--narrow-multiple``)
  gives the parameter count closest to CoMERA's at the end;
* ``lowrank``: every layer CoMERA tensorized (``comera_lightning.rank.tt_layers``) replaced by a plain
  ``U·V`` of one rank, the largest whose parameters fit CoMERA's final count in those layers;
* ``galore``: the dense model with ``pytorch_optimizer.GaLore`` (rank width/4 on the blocks' linear maps);
* ``dense_time``: the dense model given CoMERA's training seconds instead of its steps: its own
  warm-up + cosine over the steps that fit, from dense's seconds per step.

Reported per system (JSON): the validation curve (step, training seconds, loss, parameters), the
final loss, parameters (whole model and in the layers CoMERA tensorized), the tensor peak of a
training step (``lm.py``), the seconds; per model a summary: loss at equal steps and at equal
wall-clock (CoMERA's training seconds, each curve interpolated), relative to dense. The PNG draws
validation loss against seconds, one curve per system, one panel per model; the markdown table
printed at the end is the README's.

    python -m benchmarks.quality --quick        # a tiny Llama, 60 steps, all systems (about a minute)
    python -m benchmarks.quality --models llama:256:4 --systems dense,comera --comera gate_lr=0.01

The long-horizon race (``sweep.py``): ``--tokens-per-param 20`` trains each model for 20 tokens per dense
parameter (the budget users train for), ``--lrs 3e-4,1e-3,3e-3`` trains every system at each peak LR and the
headline compares each at its best, ``--seeds 1`` reruns dense and CoMERA at their best LR with another seed
(the spread), ``--warmup 0.1 --min-lr 0.1`` is the anchors' schedule (docs/TUNING_LONG_RACE.md, "The long-horizon race").

The full race (four models, 400 steps each; a few hours in all on 2 cores, estimated) as two
one-thread processes side by side, one per family, then merged into one JSON, PNG and table:

    python -m benchmarks.quality --models llama:256:4,llama:512:4 --out benchmarks/results/quality_llama.json &
    python -m benchmarks.quality --models gpt2:256:4,gpt2:512:4 --out benchmarks/results/quality_gpt2.json &
    wait
    python -m benchmarks.quality --out benchmarks/results/quality.json \
        --merge benchmarks/results/quality_llama.json benchmarks/results/quality_gpt2.json

Text files instead of the code corpus: ``--data-files`` (C4 shards, ``.jsonl[.gz]``, ``.txt``; ``--val-files``,
``--tokenizer-file``). The anchors' LLaMA-60M/130M recipe on a GPU is ``recipe.py`` on this machinery.

Results go to ``benchmarks/results/quality[_quick].json`` and ``.png`` unless ``--out`` says otherwise. One system's
training run and every system at one LR (what this race and the sweep share) are ``runs.py``.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.probes import RESULTS, ROOT, machine_basics
from benchmarks.quality import report
from benchmarks.quality.models import ModelSpec
from benchmarks.quality.runs import comera_callback, fit, print_result, race_at_lr
from benchmarks.quality.settings import QUICK_MODELS, FULL_MODELS, SYSTEMS, RaceSettings, parse_args, settings_of
from benchmarks.quality.sweep import race_model

__all__ = ["SYSTEMS", "RaceSettings", "comera_callback", "data_module", "finish", "fit", "main", "print_result", "race_at_lr",
           "run_header"]


def data_module(settings: RaceSettings, train_tokens: int | None = None) -> Any:
    """The causal-LM data, split and tokenized (the tokenizer is cached): ``settings.data_files`` (at most
    ``train_tokens`` tokens of them; a file the reader refuses is a SystemExit naming it), else the code corpus."""
    from comera_lightning.data import CodeCorpusDataModule

    if settings.data_files:
        try:
            return _ready(_text_files(settings, train_tokens))
        except (ValueError, FileNotFoundError) as error:
            raise SystemExit(f"--data-files: {error}") from None
    return _ready(CodeCorpusDataModule(objective="clm", block_size=settings.block_size, batch_size=settings.batch_size,
                                       vocab_size=settings.vocab_size, max_bytes=settings.max_bytes, seed=settings.seed,
                                       tokenizer_file=settings.tokenizer_file))


def _text_files(settings: RaceSettings, train_tokens: int | None) -> Any:
    """The text files' data module; validation reads only the blocks it uses."""
    from comera_lightning.data import TextFilesDataModule

    return TextFilesDataModule(settings.data_files, settings.val_files or None, text_field=settings.text_field,
                               block_size=settings.block_size, batch_size=settings.batch_size,
                               vocab_size=settings.vocab_size, tokenizer_file=settings.tokenizer_file,
                               max_train_tokens=train_tokens,
                               max_val_tokens=settings.val_batches * settings.batch_size * settings.block_size,
                               seed=settings.seed)


def _ready(data: Any) -> Any:
    """``data`` with its tokenizer built and its training and validation blocks packed."""
    data.prepare_data()
    data.setup("fit")
    return data


def _revision() -> str | None:
    proc = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() or None


def run_header(command: str, settings: RaceSettings, data: Any) -> dict[str, Any]:
    """What a results JSON starts with: the command, the machine (its GPU on CUDA), the settings, the vocabulary."""
    import torch
    import transformers

    machine = {**machine_basics(), "torch": torch.__version__, "transformers": transformers.__version__,
               "platform": platform.platform(), "revision": _revision()}
    if settings.device == "cuda":
        machine["gpu"] = torch.cuda.get_device_name()
    return {"command": command.replace(f"{ROOT}/", ""), "machine": machine, "settings": asdict(settings),
            "vocab_size": data.vocab_size, "models": {}}


def finish(results: dict[str, Any], out: Path, started: float) -> None:
    """Write the JSON and PNG at ``out``; print the markdown table (and the LR grid of a sweep)."""
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    out, png = report.write(results, out)
    print(report.markdown_table(results))
    if len(results["settings"]["lrs"]) > 1:
        print("\n" + report.grid_table(results))
    print(f"\nwrote {out} and {png} ({results['wall_seconds']:.0f} s)", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.merge:
        out, png = report.write(report.merge(args.merge), args.out)
        print(report.markdown_table(json.loads(out.read_text())))
        print(f"\nwrote {out} and {png}", file=sys.stderr)
        return
    import torch

    settings = settings_of(args)
    torch.set_num_threads(settings.threads)
    started = time.perf_counter()
    data = data_module(settings)
    models = [ModelSpec.parse(m) for m in (args.models or (QUICK_MODELS if args.quick else FULL_MODELS)).split(",")]
    command = "python -m benchmarks.quality " + " ".join(sys.argv[1:] if argv is None else argv)
    results = run_header(command, settings, data)
    for spec in models:
        results["models"][spec.label()] = race_model(spec, settings, data, args.systems)
    finish(results, args.out or RESULTS / f"quality{'_quick' if args.quick else ''}.json", started)
