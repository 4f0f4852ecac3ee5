"""LM batching of the code corpus: BERT masking statistics, seeded dynamic masking, packed blocks."""

from __future__ import annotations

import pytest
import torch

from comera_lightning.data.code import MLMCollator, pack_blocks

SPECIAL = [0, 1, 2, 3, 4]  # <s>, <pad>, </s>, <unk>, <mask>


MASK_ID = 4


def test_masking_statistics_on_a_large_batch() -> None:
    torch.manual_seed(0)
    vocab = 1000
    ids = torch.randint(5, vocab, (64, 512))
    ids[:, 0] = 0  # <s>
    ids[:, 100::50] = 2  # </s> separators
    ids[:, 10:20] = 3  # <unk>
    attention = torch.ones_like(ids, dtype=torch.bool)
    attention[-8:, 300:] = False
    ids[~attention] = 1  # <pad>
    collator = MLMCollator(MASK_ID, vocab, SPECIAL, generator=torch.Generator().manual_seed(1))
    items = [{"input_ids": i, "attention_mask": a} for i, a in zip(ids, attention)]
    batch = collator(items)

    special = torch.isin(ids, torch.tensor(SPECIAL)) | ~attention
    selected = batch["labels"] != -100
    assert not selected[special].any()  # special tokens and padding are never selected
    assert torch.equal(batch["labels"][selected], ids[selected])
    rate = selected.sum().item() / (~special).sum().item()
    assert abs(rate - 0.15) < 0.01

    out = batch["input_ids"][selected]
    original = ids[selected]
    masked = (out == MASK_ID).float().mean().item()
    kept = (out == original).float().mean().item()
    randomised = ((out != MASK_ID) & (out != original)).float().mean().item()
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.015 and abs(randomised - 0.1) < 0.015
    assert not torch.isin(out[out != MASK_ID], torch.tensor(SPECIAL)).any()  # random tokens are never special
    assert torch.equal(batch["input_ids"][~selected], ids[~selected])  # unselected tokens untouched
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.long
    assert batch["attention_mask"].dtype == torch.bool


def test_masking_is_dynamic_and_seeded() -> None:
    ids = torch.randint(5, 100, (4, 64))
    attention = torch.ones_like(ids, dtype=torch.bool)
    collator = MLMCollator(MASK_ID, 100, SPECIAL)
    first, _ = collator.mask(ids, attention, torch.Generator().manual_seed(0))
    again, _ = collator.mask(ids, attention, torch.Generator().manual_seed(0))
    other, _ = collator.mask(ids, attention, torch.Generator().manual_seed(1))
    assert torch.equal(first, again) and not torch.equal(first, other)
    with pytest.raises(ValueError, match="mlm_probability"):
        MLMCollator(MASK_ID, 100, SPECIAL, mlm_probability=1.5)


def test_pack_blocks_separates_documents_and_pads_the_tail() -> None:
    blocks, lengths = pack_blocks([[5, 6, 7], [8, 9]], 4, bos_id=0, sep_id=2, pad_id=1)
    assert blocks.tolist() == [[0, 5, 6, 7], [0, 2, 8, 9], [0, 2, 1, 1]]
    assert lengths.tolist() == [4, 4, 2]
    blocks, lengths = pack_blocks([[5, 6], [7]], 6, bos_id=0, sep_id=2, pad_id=1)
    assert blocks.tolist() == [[0, 5, 6, 2, 7, 2]] and lengths.tolist() == [6]
