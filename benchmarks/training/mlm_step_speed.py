"""Training-step time of the CodeBERT-like masked LM: dense vs tensorized, interleaved in one process.

Builds two ``MaskedLanguageModel`` copies from the same seed, tensorizes one the way the
issue-7 quality run does (word embedding, attention and FFN projections, LM-head dense and
decoder; rank 16, embedding rank 32), then times a full training step (forward,
masked-token cross-entropy, backward, AdamW) of each on the same random token blocks, masked
by the data module's ``MLMCollator`` (15 %, 80/10/10), alternating dense/TT so that machine load hits both alike. Prints a table and writes
JSON.

    python -m benchmarks.training.mlm_step_speed [--d-model 384 --layers 4 --d-ff 1536 --vocab 8192
        --block 128 --batch 16 --rank 16 --embedding-rank 32 --steps 10 --threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.probes import machine_basics
from comera_lightning import tensorize
from comera_lightning.data.code import MLMCollator
from comera_lightning.models.codebert import MaskedLanguageModel

TARGETS = [
    "word_embeddings", "query", "key", "value", "attention.output",
    "ffn.intermediate", "ffn.output", "lm_head.dense", "lm_head.decoder",
]


def build(args: argparse.Namespace) -> MaskedLanguageModel:
    torch.manual_seed(0)
    return MaskedLanguageModel(
        vocab_size=args.vocab, d_model=args.d_model, num_layers=args.layers, num_heads=max(1, args.d_model // 64),
        d_ff=args.d_ff, max_positions=args.block, type_vocab_size=1, pad_token_id=1, tie_word_embeddings=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--embedding-rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/mlm_step_speed.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dense, tt = build(args), build(args)
    tensorize(tt, target_modules=TARGETS, max_rank=args.rank, embedding_max_rank=args.embedding_rank, min_compression=1.0, num_cores=3)
    generator = torch.Generator().manual_seed(0)
    collate = MLMCollator(mask_token_id=4, vocab_size=args.vocab, special_token_ids=range(5), generator=generator)
    batches = [
        collate([{"input_ids": torch.randint(5, args.vocab, (args.block,), generator=generator),
                  "attention_mask": torch.ones(args.block, dtype=torch.long)} for _ in range(args.batch)])
        for _ in range(args.warmup + args.steps)
    ]
    systems = {}
    for name, model in (("dense", dense), ("tt", tt)):
        model.train()
        model.log = lambda *a, **k: None  # no Trainer attached: logging is not what is timed
        systems[name] = {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-4), "ms": []}
    for i, batch in enumerate(batches):
        for system in systems.values():
            start = time.perf_counter()
            system["optimizer"].zero_grad(set_to_none=True)
            system["model"].training_step(dict(batch), i).backward()
            system["optimizer"].step()
            if i >= args.warmup:
                system["ms"].append(1000 * (time.perf_counter() - start))

    results = {
        name: {"step_ms_median": statistics.median(s["ms"]), "step_ms_all": s["ms"],
               "parameters": sum(p.numel() for p in s["model"].parameters())}
        for name, s in systems.items()
    }
    speedup = results["dense"]["step_ms_median"] / results["tt"]["step_ms_median"]
    smaller = results["dense"]["parameters"] / results["tt"]["parameters"]
    print(f"{'system':8s} {'step ms (median)':>17s} {'parameters':>12s}")
    for name, r in results.items():
        print(f"{name:8s} {r['step_ms_median']:17.0f} {r['parameters']:12,d}")
    print(f"tensorized step {speedup:.2f}x faster, model {smaller:.1f}x smaller "
          f"({args.batch}x{args.block} tokens, {args.threads} thread(s), {args.steps} timed steps)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "benchmark": "mlm_step_speed", "settings": vars(args), "results": results,
        "ratios": {"dense_over_tt_step_time": speedup, "dense_over_tt_parameters": smaller},
        "machine": {**machine_basics(), "torch": torch.__version__, "threads": args.threads},
    }, indent=1))


if __name__ == "__main__":
    main()
