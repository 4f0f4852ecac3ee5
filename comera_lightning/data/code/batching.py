"""LM batching: packing token streams into fixed blocks (`pack_blocks`, `PackedBlocks`), BERT masking
(`MLMCollator`) and next-token labels (`CausalLMCollator`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["CausalLMCollator", "MLMCollator", "PackedBlocks", "pack_blocks"]


def pack_blocks(
    token_lists: Sequence[Sequence[int]], block_size: int, *, bos_id: int, sep_id: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Pack documents into `[num_blocks, block_size]` ids: `<s>` then `block_size - 1` tokens of the stream
    `doc1 </s> doc2 </s> ...`; the last block is padded. Returns the blocks and each block's real length.
    """
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    pieces = []
    for ids in token_lists:
        pieces.append(np.asarray(ids, dtype=np.int32))
        pieces.append(np.asarray([sep_id], dtype=np.int32))
    stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    body = block_size - 1
    n_blocks = -(-len(stream) // body)  # ceil
    blocks = np.full((n_blocks, block_size), pad_id, dtype=np.int32)
    blocks[:, 0] = bos_id
    padded = np.full(n_blocks * body, pad_id, dtype=np.int32)
    padded[: len(stream)] = stream
    blocks[:, 1:] = padded.reshape(n_blocks, body)
    lengths = np.full(n_blocks, block_size, dtype=np.int64)
    if n_blocks:
        lengths[-1] = 1 + len(stream) - (n_blocks - 1) * body
    return blocks, lengths


class PackedBlocks(Dataset):
    """Fixed-length token blocks; `labels` is set for evaluation splits, whose masks are drawn once."""

    def __init__(self, blocks: np.ndarray, lengths: np.ndarray, labels: torch.Tensor | None = None,
                 masked_ids: torch.Tensor | None = None) -> None:
        self.blocks = torch.from_numpy(blocks)
        positions = torch.arange(blocks.shape[1])
        self.attention_mask = positions[None, :] < torch.from_numpy(lengths)[:, None]
        self.labels = labels
        self.masked_ids = masked_ids

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.masked_ids is not None and self.labels is not None:
            return {"input_ids": self.masked_ids[index], "attention_mask": self.attention_mask[index],
                    "labels": self.labels[index]}
        return {"input_ids": self.blocks[index].long(), "attention_mask": self.attention_mask[index]}


class MLMCollator:
    """Stack blocks and apply dynamic BERT masking: select `mlm_probability` of the non-special tokens; of
    those, 80% become `<mask>`, 10% a random non-special token and 10% stay; labels are -100 elsewhere.
    """

    def __init__(
        self,
        mask_token_id: int,
        vocab_size: int,
        special_token_ids: Sequence[int],
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        generator: torch.Generator | None = None,
    ) -> None:
        if not 0 < mlm_probability < 1:
            raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
        if mask_replace_prob < 0 or random_replace_prob < 0 or mask_replace_prob + random_replace_prob > 1:
            raise ValueError("mask_replace_prob and random_replace_prob must be >= 0 with a sum <= 1, got "
                             f"{mask_replace_prob} and {random_replace_prob}")
        self.mask_token_id = mask_token_id
        self.mlm_probability = mlm_probability
        self.mask_replace_prob = mask_replace_prob
        self.random_replace_prob = random_replace_prob
        self.generator = generator
        self.special_token_ids = torch.tensor(sorted(set(special_token_ids)), dtype=torch.long)
        allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed[self.special_token_ids[self.special_token_ids < vocab_size]] = False
        self.random_candidates = allowed.nonzero().flatten()

    def __call__(self, items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Stack `input_ids`/`attention_mask` and mask them (items that carry `labels` are stacked as they are)."""
        input_ids = torch.stack([item["input_ids"] for item in items]).long()
        attention_mask = torch.stack([item["attention_mask"] for item in items])
        if "labels" in items[0]:
            labels = torch.stack([item["labels"] for item in items])
            return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
        input_ids, labels = self.mask(input_ids, attention_mask)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    def mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return masked ids and labels for a `[batch, length]` id tensor (the input is not modified)."""
        gen = generator if generator is not None else self.generator
        input_ids = input_ids.clone()
        maskable = attention_mask.bool() & ~torch.isin(input_ids, self.special_token_ids)
        selected = (torch.rand(input_ids.shape, generator=gen) < self.mlm_probability) & maskable
        labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
        # One uniform draw per token picks <mask> / random / unchanged with the configured ratios.
        choice = torch.rand(input_ids.shape, generator=gen)
        to_mask = selected & (choice < self.mask_replace_prob)
        to_random = selected & ~to_mask & (choice < self.mask_replace_prob + self.random_replace_prob)
        input_ids[to_mask] = self.mask_token_id
        n_random = int(to_random.sum())
        if n_random:
            picks = torch.randint(len(self.random_candidates), (n_random,), generator=gen)
            input_ids[to_random] = self.random_candidates[picks]
        return input_ids, labels


class CausalLMCollator:
    """Stack blocks for next-token prediction: `labels` are the input ids, -100 on padding.

    The labels are not shifted: Hugging Face causal LMs (and `F.cross_entropy(logits[:, :-1], labels[:, 1:])`)
    shift them themselves.
    """

    def __call__(self, items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """`input_ids`, `attention_mask` and `labels` of a batch of blocks."""
        input_ids = torch.stack([item["input_ids"] for item in items]).long()
        attention_mask = torch.stack([item["attention_mask"] for item in items])
        return {"input_ids": input_ids, "attention_mask": attention_mask,
                "labels": input_ids.masked_fill(~attention_mask.bool(), -100)}
