"""A plain causal LM (Hugging Face Llama, random init) on real Python source, for the quality tests of the callback."""

import lightning as L
import torch

from comera_lightning.data import CodeCorpusDataModule


class TinyCausalLM(L.LightningModule):
    """What a user writes: a Llama built from its config, one AdamW, a cosine schedule; logs val/loss."""

    def __init__(self, vocab_size: int, width: int = 64, lr: float = 3e-3):
        super().__init__()
        import transformers

        config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=width, intermediate_size=4 * width,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
        self.model, self.lr = transformers.LlamaForCausalLM(config), lr

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.model(**batch).loss)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def code_lm_data(tmp_path) -> CodeCorpusDataModule:
    """Next-token batches of the standard library's source (a small BPE trained offline)."""
    data = CodeCorpusDataModule(objective="clm", vocab_size=512, block_size=32, batch_size=16, max_bytes=400_000,
                                cache_dir=str(tmp_path / "cache"))
    data.prepare_data()
    data.setup("fit")
    return data


def tiny_llama(vocab_size: int = 384, width: int = 32, layers: int = 1, seed: int = 0):
    """A random-init LlamaForCausalLM small enough to torch.compile in seconds (untied head: a vocabulary head)."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=width, intermediate_size=2 * width,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


class ForwardLM(L.LightningModule):
    """A causal LM for ``Trainer.fit(torch.compile(module, fullgraph=True))``: Lightning compiles its steps, so they
    call ``forward`` and log nothing (``self.log`` is a graph break): the loss is logged from a hook."""

    def __init__(self, lr: float = 3e-3, **llama):
        super().__init__()
        self.model, self.lr = tiny_llama(**llama), lr

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss

    def training_step(self, batch, batch_idx):
        return self(batch[0])

    def validation_step(self, batch, batch_idx):
        return self(batch[0])

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.log("val/loss", outputs)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)
