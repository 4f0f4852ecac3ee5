"""The systems ``transformer_speed.py`` compares: the paper's model, its optimizers, the CoMERA stages, the batches.

``dense``, ``galore``, ``comera`` (early stage) and ``comera_pruned`` (a simulated late stage, pruned
physically), each a ``System`` that takes one training step on a batch of ``make_batches``.
"""

from __future__ import annotations

import argparse
from typing import Any

SYSTEMS = ("dense", "galore", "comera", "comera_pruned")
GALORE_BATCH = 1  # GaLore is compared where the paper compares it
GALORE = {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "projection_type": "std"}
GALORE_TARGETS = ("attention.query", "attention.key", "attention.value", "attention.output", "ffn.intermediate", "ffn.output")
# configs/transformer.yaml's comera: section, as ComeraCallback passes it to tensorize().
TENSORIZE = {"max_rank": 30, "embedding_max_rank": 32, "num_cores": 3, "embedding_num_cores": 4,
             "gate_threshold": 1e-2, "min_compression": 2.0, "init": "random", "include_attention": True, "include_embeddings": True}
LEARNING_RATES = {"lr_cores": 1e-4, "lr_gates": 1e-3, "lr_other": 5e-5}  # the paper's (docs/METHOD.md §2)
RANK_WEIGHT = 0.01  # γ of the early stage's L + γR
NUM_CLASSES = 3


def build_model(args: argparse.Namespace) -> Any:
    """The paper's SentencePairClassifier at the sizes in ``args``, seeded (the same weights every time)."""
    import torch

    from comera_lightning.models.transformer import SentencePairClassifier

    torch.manual_seed(args.seed)
    return SentencePairClassifier(
        vocab_size=args.vocab, d_model=args.d_model, num_layers=args.layers, num_heads=args.heads,
        d_ff=args.d_ff, max_positions=args.seq, num_classes=NUM_CLASSES,
    )


def keep_ranks_(model: Any, keep_fraction: float) -> None:
    """Simulate a late-stage state: in every bond keep ``round(keep_fraction · rank)`` gates, zero the rest."""
    import torch

    from comera_lightning.rank import tt_layers

    with torch.no_grad():
        for _, layer in tt_layers(model):
            for gate in layer.gates:
                keep = max(1, round(keep_fraction * gate.numel()))
                gate[keep:] = 0.0


def make_optimizer(system: str, model: Any, args: argparse.Namespace) -> Any:
    """GaLore for ``galore``; otherwise AdamW (or CAME) on the paper's cores/gates/other groups."""
    import torch

    from comera_lightning import CAME
    from comera_lightning.optim.param_groups import comera_param_groups

    if system == "galore":
        from pytorch_optimizer import GaLore

        projected = [p for n, p in model.named_parameters()
                     if p.dim() == 2 and ".encoder." in n and n.removesuffix(".weight").endswith(GALORE_TARGETS)]
        chosen = {id(p) for p in projected}
        others = [p for p in model.parameters() if id(p) not in chosen]
        return GaLore([{"params": others}, {"params": projected, **GALORE}], lr=LEARNING_RATES["lr_other"], weight_decay=0.0)
    groups = comera_param_groups(model, **LEARNING_RATES)
    if args.optimizer == "came":
        return CAME(groups, lr=LEARNING_RATES["lr_other"])
    return torch.optim.AdamW(groups, weight_decay=0.0)


class System:
    """One trainable system: model, optimizer and (for CoMERA) its TT layers and surrogate normaliser."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        from comera_lightning import tensorize
        from comera_lightning.rank import prune_, surrogate_normalizer, tt_layers

        self.name = name
        self.model = build_model(args)
        self.layers: list[Any] = []
        self.normalizer = 0.0
        if name.startswith("comera"):
            tensorize(self.model, **TENSORIZE)
            self.layers = [m for _, m in tt_layers(self.model)]
            self.normalizer = surrogate_normalizer(self.layers)  # fixed at the start, as the callback does
        self.model.to(args.device)
        self.optimizer = make_optimizer(name, self.model, args)
        if name == "comera_pruned":
            keep_ranks_(self.model, args.keep_fraction)
            prune_(self.model, [self.optimizer])
        self.model.train()

    def step(self, batch: dict[str, Any]) -> float:
        """Forward, cross-entropy (+ γ·size surrogate for CoMERA), backward, optimizer step; returns the loss."""
        import torch.nn.functional as F

        from comera_lightning.rank import size_surrogate

        logits = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss = F.cross_entropy(logits, batch["labels"])
        if self.layers:
            loss = loss + RANK_WEIGHT * size_surrogate(self.layers, "mean", self.normalizer)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def describe(self) -> dict[str, Any]:
        """Parameter counts, compression of the tensorized layers and their physical ranks."""
        from comera_lightning.rank import compression_stats, tt_layers

        stats = compression_stats(self.model)
        out: dict[str, Any] = {"params_model": stats.model_parameters, "params_dense_model": stats.dense_model_parameters}
        if self.layers:
            out.update(params_tt=stats.tt_parameters, params_tt_dense=stats.dense_tt_parameters,
                       tt_compression=stats.tt_compression, model_compression=stats.model_compression,
                       ranks={n: list(m.physical_ranks) for n, m in tt_layers(self.model)})
        return out


def make_batches(batch_size: int, count: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``count`` synthetic sentence-pair batches: random ids, full 128-token masks, two segments."""
    import torch

    generator = torch.Generator().manual_seed(args.seed + batch_size)
    types = torch.zeros(batch_size, args.seq, dtype=torch.long)
    types[:, args.seq // 2:] = 1
    batches = [{
        "input_ids": torch.randint(0, args.vocab, (batch_size, args.seq), generator=generator),
        "attention_mask": torch.ones(batch_size, args.seq, dtype=torch.long),
        "token_type_ids": types,
        "labels": torch.randint(0, NUM_CLASSES, (batch_size,), generator=generator),
    } for _ in range(count)]
    return [{key: value.to(args.device) for key, value in batch.items()} for batch in batches]


def systems_for(batch_size: int) -> list[str]:
    """The systems compared at ``batch_size`` (GaLore only at batch 1)."""
    return [s for s in SYSTEMS if s != "galore" or batch_size == GALORE_BATCH]
