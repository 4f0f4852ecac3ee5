"""A plain TTEmbedding served at inference (hot rows + misses through its half tables): the training-mode rows, exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from comera_lightning.layers import TTEmbedding
from comera_lightning.rank import prune_
from tests.layers.test_hot_rows import trained_layer, zipf_ids

ROWS = 50_000


def training_rows(layer: TTEmbedding, ids: torch.Tensor) -> torch.Tensor:
    """The rows a training-mode forward computes (on a copy: training-mode forwards count ids and drop the cache)."""
    other = copy.deepcopy(layer).train()
    with torch.no_grad():
        return other(ids)


def served(layer: TTEmbedding, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return layer(ids)


def serving(layer: TTEmbedding):
    """The serving state the served batches use (kept under inference mode; with grad on it is built afresh)."""
    with torch.inference_mode():
        return layer.serving()


def hits_and_misses(layer: TTEmbedding, ids: torch.Tensor) -> tuple[int, int]:
    _, hit = serving(layer).index.find(ids.reshape(-1))
    return int(hit.sum()), int((~hit).sum())


def test_served_rows_equal_the_training_mode_rows_for_hits_and_misses():
    layer = trained_layer().eval()
    ids = zipf_ids(3000, ROWS, seed=9).view(100, 30)  # a 2-D batch, as a language model sends
    out = served(layer, ids)
    hits, misses = hits_and_misses(layer, ids)
    assert hits > 1000 and misses > 100, (hits, misses)
    assert out.shape == (100, 30, 8)
    torch.testing.assert_close(out, training_rows(layer, ids), rtol=0, atol=1e-12)
    torch.testing.assert_close(served(layer, ids[:7]), out[:7])  # a second, smaller batch reuses the spare rows
    torch.testing.assert_close(served(layer, ids[0, :1]), out[0, :1])  # one id


def test_a_row_is_the_same_bits_cached_or_contracted_as_a_miss():
    layer = trained_layer().eval()
    cold = copy.deepcopy(layer)
    cold.counted_ids.fill_(-1)  # no counts: every id is a miss, contracted through the half tables
    cold.id_counts.zero_()
    ids = layer.hot_ids()[:1500]
    warm_rows, cold_rows = served(layer, ids), served(cold, ids)
    assert hits_and_misses(layer, ids)[0] > 1000 and hits_and_misses(cold, ids)[1] == ids.numel()
    assert torch.equal(warm_rows, cold_rows)


def test_padding_idx_is_zero_when_cached_and_when_missed():
    torch.manual_seed(0)
    hot_id = int(zipf_ids(1, ROWS, seed=0)[0])
    layer = TTEmbedding(ROWS, 8, max_rank=6, num_cores=3, cache_rows=2_000, padding_idx=hot_id, dtype=torch.float64)
    layer.count_ids(zipf_ids(20_000, ROWS, seed=1))
    layer.eval()
    cold_padding = next(i for i in range(ROWS) if not bool(serving(layer).index.find(torch.tensor([i]))[1]))
    for padding in (hot_id, cold_padding):
        layer.padding_idx = padding
        ids = torch.cat([zipf_ids(500, ROWS, seed=4), torch.tensor([padding, padding])])
        out = served(layer, ids)
        assert not out[-2:].any()
        torch.testing.assert_close(out, training_rows(layer, ids), rtol=0, atol=1e-12)


def test_dead_and_pruned_ranks_serve_the_training_mode_rows():
    layer = trained_layer().eval()
    ids = zipf_ids(2000, ROWS, seed=5)
    served(layer, ids)
    with torch.no_grad():
        layer.gates[1][:3] = 0.0  # half of a bond dies: the cache is rebuilt without it
    torch.testing.assert_close(served(layer, ids), training_rows(layer, ids), rtol=0, atol=1e-12)
    with torch.no_grad():
        layer.gates[0].zero_()  # a whole bond dies: every row is zero
    assert not served(layer, ids).any() and not training_rows(layer, ids).any()
    layer.allow_rank0 = True
    prune_(layer)
    assert layer.physical_ranks[0] == 0 and not served(layer, ids).any()


def test_counting_in_eval_mode_rebuilds_the_hot_rows():
    layer = TTEmbedding(ROWS, 8, max_rank=6, num_cores=3, cache_rows=1_000, dtype=torch.float64).eval()
    ids = zipf_ids(4000, ROWS, seed=2)
    served(layer, ids)
    assert serving(layer).cached_rows() == 0  # nothing counted: every id was contracted
    layer.count_ids(ids)
    assert serving(layer).cached_rows() > 500
    torch.testing.assert_close(served(layer, ids), training_rows(layer, ids), rtol=0, atol=1e-12)


@pytest.mark.parametrize("rank, transposed", [(8, False), (4, True)])
def test_dim_64_tables_take_the_measured_faster_layout_and_stay_exact(rank, transposed):
    """8 x 8 column blocks: above torch's scalar bmm loop the right half tables stay as they are (measured 1.2x faster)."""
    torch.manual_seed(0)
    layer = TTEmbedding(ROWS, 64, max_rank=rank, num_cores=4, cache_rows=500, dtype=torch.float64)
    assert layer.col_modes[:2] == (4, 2) and layer.col_modes[2:] == (4, 2)  # M_L = M_R = 8 at the middle bond
    layer.count_ids(zipf_ids(5000, ROWS, seed=3))
    layer.eval()
    ids = zipf_ids(1000, ROWS, seed=6)
    out = served(layer, ids)
    assert serving(layer).halves.transposed is transposed
    assert min(hits_and_misses(layer, ids)) > 50
    torch.testing.assert_close(out, training_rows(layer, ids), rtol=0, atol=1e-12)
