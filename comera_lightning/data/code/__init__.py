"""A code corpus for language-model pre-training: files read (``files``), split by file (``splits``),
packed and masked or shifted into batches (``batching``), served by :class:`CodeCorpusDataModule` (``datamodule``)."""

from comera_lightning.data.code.batching import CausalLMCollator, MLMCollator, PackedBlocks, pack_blocks
from comera_lightning.data.code.datamodule import CodeCorpusDataModule
from comera_lightning.data.code.files import CodeDocument, list_source_files, read_code_jsonl, read_source_file, stdlib_dir
from comera_lightning.data.code.splits import split_documents, split_of

__all__ = [
    "CausalLMCollator", "CodeCorpusDataModule", "CodeDocument", "MLMCollator", "PackedBlocks", "list_source_files",
    "pack_blocks", "read_code_jsonl", "read_source_file", "split_documents", "split_of", "stdlib_dir",
]
