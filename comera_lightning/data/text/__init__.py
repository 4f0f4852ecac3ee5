"""Text files for causal-LM pre-training (C4 shards, JSON lines, plain text): found and read (``files``), tokenized,
packed and held out for validation (``datamodule``)."""

from comera_lightning.data.text.datamodule import TextFilesDataModule
from comera_lightning.data.text.files import held_out, read_documents, text_files

__all__ = ["TextFilesDataModule", "held_out", "read_documents", "text_files"]
