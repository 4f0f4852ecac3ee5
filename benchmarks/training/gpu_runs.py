"""The training runs of ``gpu_speed.py``: workloads, systems, and one timed ``Trainer.fit`` per mode and precision.

Workloads (``--check``: the same code on CPU with tiny shapes):

* ``llama60m``: the quality race's causal LM (``benchmarks/quality``) at LLaMA-60M's shape: width 512, 8 blocks,
  FFN 1,376, vocabulary 32,000, 256 tokens, batch 32; ``llama130m``: width 768, 12 blocks, FFN 2,048; ``llama350m``:
  width 1,024, 24 blocks, FFN 2,736; ``llama1b``: width 2,048, 24 blocks, FFN 5,461 (GaLore's shapes; batch 32 of 256
  tokens: LLaMA-1B's dense bf16-mixed step needs about 50 GB);
* ``transformer``: the paper's ``SentencePairClassifier``: 6 encoders, d_model 768, d_ff 3,072, 30,522 rows,
  128 tokens, batch 32.

Systems: ``dense``; ``comera``: ``ComeraCallback()`` with its defaults; ``comera-paper`` (the transformer): the
callback with ``configs/transformer.yaml``'s layout. CoMERA stays in its early stage (every rank alive: its
slowest step). Modes: ``eager``; ``batch1``: eager at batch 1 (the peak memory of one sample beside the batch's);
``compiled``: the module's networks compiled in place (``nn.Module.compile``) when the fit starts, after the callback
tensorized them (``Trainer.fit(torch.compile(module))`` fails on torch 2.13 with Lightning 2.6.6 for a module that calls ``self.log`` in ``training_step`` and has no wrapper of it); ``graphs``:
``CUDAGraphStrategy`` (where it refuses, the row says why and its numbers are eager ones). Every run goes through
Lightning as a user's would, on synthetic tokens; a callback synchronises the device when the warm-up ends and
when training ends: steps/s and tokens/s over the timed steps, ``torch.cuda.max_memory_allocated`` since then.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass, replace
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

SYSTEMS = {"llama": ("dense", "comera"), "transformer": ("dense", "comera", "comera-paper")}
MODES = ("eager", "graphs", "compiled", "batch1")  # batch1: eager at one sample, for the peak memory at batch 1
PRECISIONS = ("bf16-mixed", "32-true")
GRAPH_WARMUP = 4  # CUDAGraphStrategy's eager warm-up steps (3) and the capture, before the timed steps


@dataclass(frozen=True)
class Workload:
    """A model and its batches: ``kind`` llama or transformer, widths, vocabulary, tokens per sample, batch size."""

    name: str
    kind: str
    width: int
    layers: int
    ffn: int
    vocab: int
    seq: int
    batch: int
    heads: int = 0  # the transformer's (the Llama's follow its width: benchmarks/quality/models.py)


WORKLOADS = {w.name: w for w in (
    Workload("llama60m", "llama", 512, 8, 1376, 32000, 256, 32),
    Workload("transformer", "transformer", 768, 6, 3072, 30522, 128, 32, heads=12),
    Workload("llama130m", "llama", 768, 12, 2048, 32000, 256, 32),
    Workload("llama350m", "llama", 1024, 24, 2736, 32000, 256, 32),
    Workload("llama1b", "llama", 2048, 24, 5461, 32000, 256, 32),
)}
CHECK_WORKLOADS = {w.name: w for w in (
    Workload("llama60m", "llama", 32, 2, 64, 256, 16, 2),
    Workload("transformer", "transformer", 32, 2, 64, 500, 16, 2, heads=2),
    Workload("llama130m", "llama", 48, 2, 96, 256, 16, 2),
    Workload("llama350m", "llama", 64, 2, 128, 256, 16, 2),
    Workload("llama1b", "llama", 64, 4, 128, 256, 16, 2),
)}

#: The paper's ranks (30, 32) compress nothing at ``--check``'s widths.
CHECK_PAPER_LAYOUT = {"max_rank": 4, "embedding_max_rank": 4, "min_compression": 1.0}


class SyntheticTokens(Dataset):
    """``count`` samples of random tokens: a causal LM's ids and labels, or a sentence pair's ids, types, mask and class."""

    def __init__(self, workload: Workload, count: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(5, workload.vocab, (count, workload.seq), generator=g)
        if workload.kind == "llama":
            self.columns = {"input_ids": ids, "labels": ids}
        else:
            types = (torch.arange(workload.seq) >= workload.seq // 2).long().expand(count, -1)
            self.columns = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": types,
                            "labels": torch.randint(0, 3, (count,), generator=g)}
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}


def build_module(workload: Workload) -> L.LightningModule:
    """The workload's LightningModule, seeded (dense: the callback tensorizes it)."""
    L.seed_everything(0, verbose=False)
    if workload.kind == "llama":
        from benchmarks.quality.lm import CausalLM
        from benchmarks.quality.models import ModelSpec

        return CausalLM(ModelSpec("llama", workload.width, workload.layers, workload.ffn), workload.vocab, workload.seq,
                        measure_step=-1)  # (no memory profiler step)
    from comera_lightning.models.transformer import SentencePairClassifier

    return SentencePairClassifier(vocab_size=workload.vocab, d_model=workload.width, num_layers=workload.layers,
                                  num_heads=workload.heads, d_ff=workload.ffn, max_positions=workload.seq)


def system_callbacks(system: str, check: bool) -> list[L.Callback]:
    """Nothing for dense; the callback (early stage throughout) with the defaults, the paper's layout, or (``comera-end``)
    at the default budget's end size from the start (fixed ranks: its compute at the end of the late stage)."""
    if system == "dense":
        return []
    from comera_lightning import BudgetConfig, ComeraCallback, TensorizeConfig

    options: dict[str, Any] = {"early_steps": 10**9}
    if system == "comera-end":
        options["budget"] = BudgetConfig(adapt=False)
    if system == "comera-paper":
        from benchmarks.training.transformer_systems import TENSORIZE

        options["tensorize"] = TensorizeConfig(**{**TENSORIZE, **(CHECK_PAPER_LAYOUT if check else {})})
    return [ComeraCallback(**options)]


class StepClock(L.Callback):
    """Seconds and device memory of the steps after ``warmup`` (the device synchronised at both ends)."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.started, self.seconds, self.steps, self.peak_bytes = warmup, None, 0.0, 0, None

    @staticmethod
    def _sync(module: L.LightningModule) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.warmup:
            self._sync(pl_module)
            if pl_module.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(pl_module.device)
            self.started = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(pl_module)
        self.seconds, self.steps = time.perf_counter() - self.started, trainer.global_step - self.warmup
        if pl_module.device.type == "cuda":
            self.peak_bytes = torch.cuda.max_memory_allocated(pl_module.device)


class CompileNetworks(L.Callback):
    """``torch.compile`` the module's child networks in place when the fit starts (after the callback's tensorize):
    the children that hold parameters. Not its metrics: a torchmetrics ``Metric`` counts its updates in an integer
    attribute, which dynamo guards on, so a compiled one recompiled at every step (the compiled Transformer rows of
    2026-11-28 and 2026-11-30, 0.24x eager, measured that)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for child in pl_module.children():
            if next(child.parameters(), None) is not None:
                child.compile(backend=self.backend)


def _trainer(mode: str, precision: str, steps: int, callbacks: list[L.Callback], cuda: bool) -> L.Trainer:
    from comera_lightning import CUDAGraphStrategy

    strategy = CUDAGraphStrategy(device=None if cuda else "cpu") if mode == "graphs" else "auto"
    return L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, strategy=strategy, precision=precision, max_steps=steps,
                     callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0)


def timed_fit(workload: Workload, system: str, mode: str, precision: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run: warm-up steps, then ``args.steps`` timed steps; the row of the results table."""
    cuda = not args.check
    if mode == "batch1":
        workload = replace(workload, batch=1)
    warmup = args.warmup + (GRAPH_WARMUP if mode == "graphs" else 0)
    clock = StepClock(warmup)
    compiling = [CompileNetworks(args.compile_backend)] if mode == "compiled" else []
    trainer = _trainer(mode, precision, warmup + args.steps, [*system_callbacks(system, args.check), *compiling, clock], cuda)
    module = build_module(workload)
    data = DataLoader(SyntheticTokens(workload, workload.batch * (warmup + args.steps)), batch_size=workload.batch, pin_memory=cuda)
    started = time.perf_counter()
    trainer.fit(module, data)
    row = {"model": workload.name, "system": system, "mode": mode, "precision": precision, "batch": workload.batch, "steps": clock.steps,
           "steps_per_s": clock.steps / clock.seconds, "tokens_per_s": clock.steps * workload.batch * workload.seq / clock.seconds,
           "peak_gib": clock.peak_bytes / 2**30 if clock.peak_bytes is not None else None,
           "parameters": sum(p.numel() for p in module.parameters()), "wall_s": time.perf_counter() - started}
    if mode == "graphs":
        strategy = trainer.strategy
        row["note"] = f"graphs off: {strategy.refusal}" if strategy.refusal else f"{strategy.graph_cache.replays} replays"
    return row


def release(compiled: bool) -> None:
    """Free what a run left: its graphs, compiled code and cached device memory."""
    if compiled:
        torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
