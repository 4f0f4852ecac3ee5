"""TensorizeReport states the TT parts' compression exactly as ``comera/compression_tt`` logs it."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("torchrec")
from torch import nn  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection  # noqa: E402

from comera_lightning import tensorize  # noqa: E402
from comera_lightning.rank import compression_stats  # noqa: E402


def test_report_of_a_collection_with_dense_tables_gives_the_logged_tt_compression() -> None:
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=n, feature_names=[f"f{i}"]) for i, n in enumerate([5000, 20])]
    model = nn.ModuleDict({"ebc": EmbeddingBagCollection(tables)})
    text = str(tensorize(model, embedding_max_rank=8, embedding_num_cores=3))
    stats = compression_stats(model)
    assert stats.dense_tt_parameters < 5020 * 16, "the small table stays dense inside the collection"
    parts = re.search(r"TT parts alone ([\d,]+) -> ([\d,]+) \(([\d.]+)x", text)
    assert parts, text
    assert int(parts[1].replace(",", "")) == stats.dense_tt_parameters and int(parts[2].replace(",", "")) == stats.tt_parameters
    assert float(parts[3]) == round(stats.tt_compression, 1)
