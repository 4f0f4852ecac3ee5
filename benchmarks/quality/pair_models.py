"""The sentence-pair classifiers ``compress_pairs`` compresses: the package's Transformer (``make demo``'s) and a Hugging
Face BERT written as ``examples/huggingface.py`` writes it (code nobody here wrote, random init from its config).

Each kind: a ``build(data, width)`` giving a fresh LightningModule of that width (feed-forward 4× the width), its
full ``width``, the head count that a narrower width must be a multiple of, and ``set_lr(model, lr)`` (every group's LR,
before its optimizer is built: ``compress_pairs --ft-lr``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from benchmarks.quality.pairs_frontier import DATA
from benchmarks.quality.pairs_frontier import MODEL as TRANSFORMER
from benchmarks.quality.pairs_frontier import _model as _transformer
from comera_lightning.data.pairs import SentencePairDataModule

#: ``examples/huggingface.py``'s BERT (its ``BertConfig``), AdamW 1e-3 with a cosine schedule over the run.
BERT = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512,
        "max_position_embeddings": 128, "lr": 1e-3}


class BertPairClassifier(L.LightningModule):
    """``examples/huggingface.py``'s ``BertClassifier``, its model built at once (so trained weights load into it)."""

    def __init__(self, vocab_size: int, num_classes: int, pad_token_id: int, hidden_size: int, num_hidden_layers: int,
                 num_attention_heads: int, intermediate_size: int, max_position_embeddings: int, lr: float) -> None:
        super().__init__()
        import transformers

        self.save_hyperparameters()
        config = transformers.BertConfig(
            vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads, intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings, num_labels=num_classes, pad_token_id=pad_token_id)
        self.bert = transformers.BertForSequenceClassification(config)

    def forward(self, batch: dict[str, torch.Tensor]) -> Any:
        return self.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         token_type_ids=batch["token_type_ids"], labels=batch.get("labels"))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch).loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: dict[str, torch.Tensor], split: str) -> None:
        out = self(batch)
        self.log(f"{split}/loss", out.loss)
        self.log(f"{split}/acc", (out.logits.argmax(-1) == batch["labels"]).float().mean())

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def _bert_lr(model: BertPairClassifier, lr: float) -> None:
    model.hparams.lr = lr


def group_lrs(model: L.LightningModule, lr: float) -> None:
    """``lr`` for both param groups of a package model (``param_group_settings``: cores and the rest)."""
    model.param_group_settings = dataclasses.replace(model.param_group_settings, lr_cores=lr, lr_other=lr)


def _bert(data: SentencePairDataModule, width: int) -> BertPairClassifier:
    shape = {**BERT, "hidden_size": width, "intermediate_size": 4 * width}
    return BertPairClassifier(data.vocab_size, data.num_classes, data.pad_token_id, **shape)


class PairLogits(torch.nn.Module):
    """A pair classifier called on ``(input_ids, attention_mask, token_type_ids)``, returning its class logits: what
    an exported program of it serves."""

    def __init__(self, model: L.LightningModule) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.model, BertPairClassifier):
            batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            return self.model(batch).logits
        return self.model(input_ids, attention_mask, token_type_ids)


def pair_inputs(vocab_size: int, length: int, two_sentences: bool = True) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """``batch -> (input_ids, attention_mask, token_type_ids)`` of ``length`` tokens (the second half the second
    sentence, unless one text: ``two_sentences=False``), the same ids at every call."""
    ids = torch.randint(0, vocab_size, (32, length), generator=torch.Generator().manual_seed(0))
    types = (torch.arange(length) >= length // 2).long().expand(32, length) * two_sentences
    mask = torch.ones(32, length, dtype=torch.bool)
    return lambda batch: (ids[:batch], mask[:batch], types[:batch])


@dataclass(frozen=True)
class PairModel:
    """One kind of classifier: its settings (recorded in the results), full width, head count, builder, LR setter and
    data (a data module class and its settings, recorded too: the clothing-review pairs unless given)."""

    settings: dict[str, Any]
    width: int
    heads: int
    build: Callable[[Any, int], L.LightningModule]
    set_lr: Callable[[L.LightningModule, float], None]
    data_class: type[L.LightningDataModule] = SentencePairDataModule
    data_settings: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(DATA))

    def data(self, seed: int) -> L.LightningDataModule:
        """The kind's data module, split by ``seed``."""
        return self.data_class(**self.data_settings, seed=seed)

    def narrow_width(self, data: SentencePairDataModule, target: int) -> int:
        """The width (a multiple of the head count, below the full one) whose dense model is nearest ``target``
        parameters."""
        def size(width: int) -> int:
            return sum(p.numel() for p in self.build(data, width).parameters())

        return min(range(self.heads, self.width, self.heads), key=lambda w: abs(size(w) - target))


PAIR_MODELS = {
    "transformer": PairModel(TRANSFORMER, TRANSFORMER["d_model"], TRANSFORMER["num_heads"], _transformer, group_lrs),
    "bert": PairModel(BERT, BERT["hidden_size"], BERT["num_attention_heads"], _bert, _bert_lr),
}
