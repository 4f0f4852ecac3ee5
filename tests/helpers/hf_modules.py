"""Hugging Face classifiers built in ``configure_model``, a token task, and the drop-in fit (the callback's defaults).

The test's own copy of what ``benchmarks/training/drop_in.py`` measures (tests never import a benchmark).
"""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from comera_lightning import ComeraCallback, tensorized_checkpoints
from comera_lightning.rank import compression_stats

VOCAB, NUM_LABELS = 2048, 4


def hf_model(kind: str):
    """A random-init Hugging Face sequence classifier (no download)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, num_labels=NUM_LABELS, pad_token_id=0)
    if kind == "bert":
        config = tf.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                               max_position_embeddings=64, **common)
        return tf.BertForSequenceClassification(config)
    if kind == "llama":
        config = tf.LlamaConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                intermediate_size=512, max_position_embeddings=64, **common)
        return tf.LlamaForSequenceClassification(config)
    config = tf.GPT2Config(n_embd=128, n_layer=2, n_head=4, n_positions=64, **common)
    return tf.GPT2ForSequenceClassification(config)


@tensorized_checkpoints
class HFClassifier(L.LightningModule):
    """A plain module that builds its Hugging Face model in configure_model, as Lightning recommends."""

    def __init__(self, kind: str = "bert", optimizer: str = "adamw"):
        super().__init__()
        self.save_hyperparameters()
        self.model = None

    def configure_model(self):
        if self.model is None:
            self.model = hf_model(self.hparams.kind)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits

    def training_step(self, batch, batch_idx):
        loss = self.model(input_ids=batch[0], labels=batch[1]).loss
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.model(input_ids=batch[0], labels=batch[1]).loss)

    def configure_optimizers(self):
        if self.hparams.optimizer == "sgd":
            optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        else:
            optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def token_loaders(n: int = 512, seq: int = 32, seed: int = 0):
    """A learnable 4-class token task (the class is the first token mod 4): 16 training batches of 32."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, seq), generator=g)
    labels = ids[:, 0] % NUM_LABELS
    return DataLoader(TensorDataset(ids, labels), batch_size=32), DataLoader(TensorDataset(ids[:128], labels[:128]), batch_size=64)


class PruneTracker(L.Callback):
    """Tensorized parameters at the stage switch and ``steps`` late-stage steps later; validation losses."""

    def __init__(self, steps: int = 150):
        self.steps, self.at_switch, self.after, self.val_losses = steps, None, None, []
        self._switch_step, self._previous = None, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        comera = next((c for c in trainer.callbacks if isinstance(c, ComeraCallback)), None)
        now = compression_stats(pl_module).tt_parameters
        if comera is not None and comera.stage != "early" and self._switch_step is None:
            self._switch_step, self.at_switch = trainer.global_step, self._previous  # before the switch's prune
        if self._switch_step is not None and trainer.global_step - self._switch_step == self.steps:
            self.after = now
        self._previous = now

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.val_losses.append(float(trainer.callback_metrics["val/loss"]))

    @property
    def reduction(self) -> float:
        """Fraction of the tensorized parameters removed within ``steps`` late-stage steps."""
        return 1 - self.after / self.at_switch


def fit_with_defaults(model, loaders, max_epochs: int = 13, comera: bool = True, late_objective: str = "guarded", **trainer_kwargs):
    """The drop-in run: only max_rank, early_epochs and target_ratio set on the callback (``comera=False``: dense)."""
    callback, tracker = ComeraCallback(max_rank=16, early_epochs=3, target_ratio=0.2, late_objective=late_objective), PruneTracker()
    trainer = L.Trainer(
        max_epochs=max_epochs, callbacks=[callback, tracker] if comera else [tracker], logger=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", **trainer_kwargs,
    )
    trainer.fit(model, *loaders)
    return trainer, callback, tracker
