"""The layout a trained token table starts in: two factors where they keep clearly more of it, else the TT-matrix."""

import torch
from torch import nn

from comera_lightning.layers.shapes import table_modes
from comera_lightning.tensorize import TensorizeConfig, tensorize
from comera_lightning.tensorize.build import pin_trained_tables
from comera_lightning.tensorize.table_form import TOKEN_TABLE_CORES, token_table_cores
from comera_lightning.checkpoint import restore_tensorized

ROWS, DIM = 512, 64


def low_rank_table(rank: int = 6) -> torch.Tensor:
    """A 512 × 64 table of rank ``rank``: its SVD is exact at that rank, its TT-matrix unfolding is not."""
    torch.manual_seed(0)
    return torch.randn(ROWS, rank) @ torch.randn(rank, DIM)


def kronecker_table() -> torch.Tensor:
    """A table that is one Kronecker product of its TT-matrix's modes: the TT-matrix holds it exactly at rank 1."""
    torch.manual_seed(0)
    (r1, r2), (c1, c2) = table_modes(ROWS, DIM, TOKEN_TABLE_CORES, None, None)
    return torch.kron(torch.randn(r1, c1), torch.randn(r2, c2))


def test_the_layout_that_keeps_more_of_the_table_is_chosen():
    assert token_table_cores(low_rank_table(), 8) == 1
    assert token_table_cores(kronecker_table(), 8) == TOKEN_TABLE_CORES


def test_a_tie_a_squat_table_and_a_table_without_values_keep_the_tt_matrix():
    torch.manual_seed(0)
    assert token_table_cores(torch.randn(ROWS, DIM), 16) == TOKEN_TABLE_CORES  # noise: both layouts lose alike
    assert token_table_cores(low_rank_table()[:DIM], 8) == TOKEN_TABLE_CORES  # no taller than wide (positions)
    assert token_table_cores(torch.empty(ROWS, DIM, device="meta"), 8) == TOKEN_TABLE_CORES
    assert token_table_cores(torch.randn(32 * DIM, DIM), 8) == 1  # tall: two factors without measuring


class Table(nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.embed = nn.Embedding(*weight.shape)
        self.embed.weight.data.copy_(weight)
        self.ffn = nn.Linear(DIM, 32)

    def forward(self, ids):
        return self.ffn(self.embed(ids))


def test_a_trained_table_built_as_two_factors_keeps_its_spectrum_and_a_checkpoint_rebuilds_it():
    config = TensorizeConfig(init="svd", embedding_max_rank=8, min_compression=0)
    model = Table(low_rank_table())
    report = tensorize(model, config)
    assert model.embed.row_modes == (ROWS, 1)
    ids = torch.arange(ROWS)
    torch.testing.assert_close(model.embed(ids), low_rank_table(), rtol=1e-4, atol=1e-4)  # rank 6 <= 8: exact
    state = model.state_dict()
    fresh = Table(torch.zeros(ROWS, DIM))  # load_from_checkpoint: the pinned record, under init="random"
    assert restore_tensorized(fresh, {"comera": {"tensorize": pin_trained_tables(config, report.swapped).to_dict()},
                                      "state_dict": state})
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh(ids), model(ids))
    kept = Table(kronecker_table())
    tensorize(kept, config)
    assert kept.embed.row_modes != (ROWS, 1) and len(kept.embed.cores) == TOKEN_TABLE_CORES
