"""Output heads are found by what they are (name, vocabulary, class count, structure), not by registration order."""

import pytest
import torch
from torch import nn

from comera_lightning import tensorize
from comera_lightning.tensorize.heads import output_heads


class Block(nn.Module):
    """A transformer-like MLP block with no nn.MultiheadAttention (as litgpt's and Hugging Face's are)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class HeadFirst(nn.Module):
    """Registers its head first, under a name no rule knows, then an input projection and its blocks."""

    def __init__(self, features: int = 32, width: int = 64, outputs: int = 10, num_classes: int | None = None) -> None:
        super().__init__()
        self.out = nn.Linear(width, outputs)
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(2))
        if num_classes is not None:
            self.num_classes = num_classes

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def _heads(model):
    return output_heads(model, [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)])


def test_a_head_registered_first_is_still_the_head_and_the_last_block_is_not():
    model = HeadFirst()
    heads = _heads(model)
    assert list(heads) == ["out"], heads
    report = tensorize(model, max_rank=4, min_compression=0.0)
    skipped = dict(report.skipped)
    assert "output head" in skipped["out"]
    swapped = {r.name for r in report.swapped}
    assert {"blocks.1.fc2", "blocks.1.fc1", "blocks.0.fc1", "embed"} <= swapped
    assert model(torch.randn(3, 32)).shape == (3, 10)


def test_a_head_mapping_to_the_declared_class_count_wins_over_structure():
    model = HeadFirst(num_classes=10)
    model.aux = nn.Linear(64, 3)  # registered last, its output taken by no layer: structure alone would pick it
    assert _heads(model) == {"out": "maps to the model's 10 classes (num_classes)"}
    del model.num_classes
    assert list(_heads(model)) == ["aux"]


def test_named_and_vocabulary_heads_win_over_structure():
    model = HeadFirst()
    model.lm_head = nn.Linear(64, 100)
    model.tok = nn.Embedding(100, 64)
    model.decoder = nn.Linear(64, 100)
    heads = _heads(model)
    assert set(heads) == {"lm_head", "decoder"}
    assert "vocabulary of 100" in heads["decoder"]


def test_litgpt_blocks_are_tensorized_and_lm_head_is_the_head():
    litgpt = pytest.importorskip("litgpt")
    config = litgpt.Config(block_size=32, vocab_size=256, padded_vocab_size=256, n_layer=2, n_head=4, n_embd=64,
                           n_query_groups=2, intermediate_size=128, mlp_class_name="LLaMAMLP", bias=False, norm_class_name="RMSNorm")
    model = litgpt.GPT(config)
    assert list(dict(model.named_children()))[0] == "lm_head"  # registered before the blocks
    report = tensorize(model, max_rank=4, min_compression=0.0)
    swapped = {r.name for r in report.swapped}
    assert {f"transformer.h.{i}.mlp.proj" for i in range(2)} <= swapped
    decided = swapped | {name for name, _ in report.skipped}
    assert {f"transformer.h.{i}.attn.qkv" for i in range(2)} <= decided  # fused q/k/v: swapped, or skipped with the reason
    explicit = tensorize(litgpt.GPT(config), max_rank=4, min_compression=0.0, target_modules=["qkv"])
    assert [r.name for r in explicit.swapped] == [f"transformer.h.{i}.attn.qkv" for i in range(2)]  # one TT linear each
    assert "lm_head" in swapped  # a head to the vocabulary: tensorized with the default include_heads=True
    kept = tensorize(litgpt.GPT(config), max_rank=4, min_compression=0.0, include_heads=False)
    assert [name for name, reason in kept.skipped if "output head" in reason] == ["lm_head"]
    assert model(torch.randint(0, 256, (2, 8))).shape == (2, 8, 256)


def test_square_layers_are_no_heads_to_a_position_table_as_wide_as_the_model():
    from comera_lightning.models.transformer import SentencePairClassifier

    model = SentencePairClassifier(vocab_size=512, num_classes=3, d_model=64, num_layers=1, num_heads=4, d_ff=128,
                                   max_positions=64)  # a 64 x 64 position table, like make demo's model
    heads = _heads(model)
    assert set(heads) == {"classifier"}, heads  # not the blocks' 64 -> 64 projections, not the pooler
    model.decoder = nn.Linear(64, 512)  # a map back to the token table's vocabulary still is one
    assert "vocabulary of 512" in _heads(model)["decoder"]


@pytest.mark.parametrize("name, is_position", [("position_embeddings", True), ("transformer.wpe", True),
                                               ("embed_positions", True), ("pos_embedding", True),
                                               ("word_embeddings", False), ("token_type_embeddings", False)])
def test_position_tables_are_told_by_name(name, is_position):
    from comera_lightning.tensorize.heads import _is_position_table

    assert _is_position_table(name) is is_position
