"""What the tensorize report says of the types a model zoo brings that cannot be converted: why, and what to do."""

import pytest
from torch import nn

from comera_lightning import tensorize
from tests.helpers.zoo_families import BY_KEY


def test_a_convolution_and_a_plain_embedding_bag_are_reported_with_what_to_do():
    model = nn.Sequential(nn.Conv2d(16, 64, 3), nn.EmbeddingBag(1000, 64), nn.Linear(256, 256), nn.Linear(256, 8))
    skipped = dict(tensorize(model, max_rank=4).skipped)
    assert "Conv2d with a 64x16x3x3 weight has no TT converter: convolutions have no TT form" in skipped["0"]
    assert "Extension points" in skipped["0"]
    assert "use nn.Embedding, or TorchRec's EmbeddingBagCollection" in skipped["1"]


def test_a_vit_patch_embedding_is_reported_and_its_blocks_are_tensorized():
    pytest.importorskip("transformers")
    model = BY_KEY["hf-vit"].build()
    report = tensorize(model, max_rank=4, min_compression=0.0, target_modules=None)
    skipped = dict(report.skipped)
    assert "convolutions have no TT form" in skipped["model.vit.embeddings.patch_embeddings.projection"]
    assert "output head" in skipped["model.classifier"]
    assert any(r.name.endswith("mlp.fc1") for r in report.swapped)
