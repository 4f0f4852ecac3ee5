import pytest
import torch
from torch import nn

from comera_lightning import TTEmbedding


@pytest.mark.parametrize("num_cores", [2, 3, 4])
@pytest.mark.parametrize("dedup", [False, True])
def test_lookup_matches_dense_table_at_every_split(num_cores, dedup):
    layer = TTEmbedding(1000, 24, max_rank=6, num_cores=num_cores, deduplicate=dedup, dtype=torch.float64)
    with torch.no_grad():
        for g in layer.gates:
            g.uniform_(0.5, 1.5)
    dense = layer.to_embedding()
    ids = torch.randint(0, 1000, (5, 9))
    ids[0, :3] = 7  # repeats
    for split in range(1, len(layer.cores)):
        layer.best_split = lambda n, s=split: s
        torch.testing.assert_close(layer(ids), dense(ids), atol=1e-12, rtol=0)


def test_tt_svd_exact_at_full_rank_with_padding_rows():
    emb = nn.Embedding(30, 12, dtype=torch.float64)  # 30 rows factorise as 6·5, 12 cols as 4·3
    layer = TTEmbedding.from_embedding(emb, max_rank=1000, num_cores=2)
    torch.testing.assert_close(layer.to_embedding().weight, emb.weight, atol=1e-10, rtol=0)


def test_one_core_is_the_table_as_two_factors_its_truncated_svd_and_unstretched():
    table = torch.randn(300, 16, dtype=torch.float64)
    layer = TTEmbedding(300, 16, max_rank=4, num_cores=1, dtype=torch.float64)
    assert (layer.row_modes, layer.col_modes) == ((300, 1), (1, 16))
    assert [tuple(c.shape) for c in layer.cores] == [(1, 300, 1, 4), (4, 1, 16, 1)]
    layer.load_table_(table)
    left, singular, right = torch.linalg.svd(table, full_matrices=False)
    best = left[:, :4] * singular[:4] @ right[:4]  # Eckart-Young: the closest rank-4 table
    torch.testing.assert_close(layer(torch.arange(300)), best, atol=1e-10, rtol=0)
    # a token owns its row of the first factor (as of a dense table): the core step rule leaves it alone
    assert layer.token_cores() == [] and TTEmbedding(300, 16, max_rank=4, num_cores=2).token_cores() == [0, 1]


def test_padding_idx_reads_zero_and_gets_no_gradient():
    layer = TTEmbedding(100, 8, max_rank=4, padding_idx=5)
    out = layer(torch.tensor([5, 5]))
    out.sum().backward()
    assert out.abs().sum() == 0
    assert all(c.grad.abs().sum() == 0 for c in layer.cores)
    out = layer(torch.tensor([5, 6]))
    assert out[0].abs().sum() == 0 and out[1].abs().sum() > 0
    assert layer.to_embedding().weight[5].abs().sum() == 0


def test_out_of_range_ids_raise():
    layer = TTEmbedding(50, 8, max_rank=4)
    with pytest.raises(IndexError, match="id 50 is out of range.*50 rows"):
        layer(torch.tensor([1, 50]))
    with pytest.raises(IndexError, match="id -1"):
        layer(torch.tensor([-1]))
    with pytest.raises(TypeError, match="integer ids"):
        layer(torch.tensor([1.0]))


def test_gradients_reach_every_core_and_gate():
    layer = TTEmbedding(200, 16, max_rank=5, num_cores=3)
    layer(torch.randint(0, 200, (64,))).square().sum().backward()
    for p in list(layer.cores) + list(layer.gates):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_paper_sized_table_compresses_over_100x():
    layer = TTEmbedding(30522, 768, max_rank=32)
    assert layer.dense_parameters() / layer.num_parameters() > 100
    assert layer.embedding_dim == 768 and layer(torch.tensor([[0, 30521]])).shape == (1, 2, 768)


def test_prune_and_strict_reload():
    layer = TTEmbedding(500, 16, max_rank=6, num_cores=3)
    with torch.no_grad():
        layer.gates[0][:2] = 0
    ids = torch.arange(500)
    before = layer(ids)
    layer.prune_()
    torch.testing.assert_close(layer(ids), before)
    fresh = TTEmbedding(500, 16, max_rank=6, num_cores=3)
    fresh.load_state_dict(layer.state_dict(), strict=True)
    torch.testing.assert_close(fresh(ids), before)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_embeddings=0, embedding_dim=4, max_rank=2), "num_embeddings must be a positive integer, got 0"),
        (dict(num_embeddings=10, embedding_dim=4, max_rank=0), "max_rank must be >= 1, got 0"),
        (dict(num_embeddings=10, embedding_dim=4, max_rank=2, padding_idx=10), "padding_idx=10"),
        (dict(num_embeddings=10, embedding_dim=4, max_rank=2, row_modes=(2, 2), col_modes=(2, 2)), "row_modes"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TTEmbedding(**kwargs)


def test_empty_batch_of_ids():
    layer = TTEmbedding(100, 8, max_rank=4)
    out = layer(torch.zeros(0, 5, dtype=torch.long))
    assert out.shape == (0, 5, 8)
    out.sum().backward()
    assert all(c.grad is not None for c in layer.cores)
