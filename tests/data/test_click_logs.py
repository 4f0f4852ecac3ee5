"""The click-log batch: collated samples with multi-id and empty bags."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrec")  # the click-log data and the DLRM are built on TorchRec

from comera_lightning.data.click_logs import ClickSample, collate_click_samples, kjt_from_id_lists  # noqa: E402


def test_collate_supports_multi_id_and_empty_bags() -> None:
    samples = [
        ClickSample(dense=[1.0, 2.0], sparse=[[3], [1, 2, 5]], label=1.0),
        ClickSample(dense=[0.0, 0.5], sparse=[[4], []], label=0.0),
    ]
    batch = collate_click_samples(samples, ["a", "b"])
    assert batch.dense.shape == (2, 2) and batch.labels.tolist() == [1.0, 0.0]
    assert batch.sparse.lengths().tolist() == [1, 1, 3, 0]
    assert batch.sparse["b"].values().tolist() == [1, 2, 5]
    with pytest.raises(ValueError, match="bags"):
        kjt_from_id_lists(["a", "b"], [[[1], [2]], [[3]]])
