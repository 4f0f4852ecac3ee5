"""DLRMClassifier: builds from click-log metadata, trains, logs AUC/NE/acc, round-trips checkpoints."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.utils.data import DataLoader

pytest.importorskip("torchrec")  # the click-log data and the DLRM are built on TorchRec

from comera_lightning import ComeraCallback, TensorizeConfig  # noqa: E402
from comera_lightning.data.criteo import CRITEO_KAGGLE_TABLE_SIZES  # noqa: E402
from comera_lightning.data.movielens import MovieLensClicksDataModule  # noqa: E402
from comera_lightning.models.dlrm import DLRMClassifier, NormalizedEntropy, binary_entropy  # noqa: E402
from tests.helpers.paths import CONFIGS  # noqa: E402

COMERA_KEYS = {"early_epochs", "late_epochs", "target_ratio", "rank_weight"}
TENSORIZE_KEYS = {"max_rank", "target_modules", "embedding_max_rank"}


@pytest.fixture(scope="module")
def movielens() -> MovieLensClicksDataModule:
    dm = MovieLensClicksDataModule(batch_size=128, eval_batch_size=512)
    dm.setup("fit")
    return dm


@pytest.fixture(scope="module")
def fixed_batch(movielens):
    torch.manual_seed(0)
    return next(iter(movielens.train_dataloader()))


def _model(dm: MovieLensClicksDataModule, **kwargs) -> DLRMClassifier:
    return DLRMClassifier(
        table_sizes=dm.table_sizes, feature_names=dm.feature_names, num_dense=dm.num_dense, **kwargs
    )


def _trainer(**kwargs) -> L.Trainer:
    options = dict(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def _loader(batch, repeats: int) -> DataLoader:
    return DataLoader([batch] * repeats, batch_size=None)


def test_module_names_are_stable(movielens):
    names = dict(_model(movielens).named_modules())
    assert type(names["model.sparse_arch.embedding_bag_collection"]).__name__ == "EmbeddingBagCollection"
    assert "model.sparse_arch.embedding_bag_collection.embedding_bags.t_user_id" in names
    assert isinstance(names["model.dense_arch.model._mlp.1._linear"], torch.nn.Linear)
    assert isinstance(names["model.over_arch.model.0._mlp.1._linear"], torch.nn.Linear)
    assert names["model.over_arch.model.1"].out_features == 1


def test_overfits_fixed_batch_and_logs_metrics(movielens, fixed_batch):
    torch.manual_seed(0)
    model = _model(movielens, lr_other=1e-2)
    with torch.no_grad():
        before = F.binary_cross_entropy_with_logits(model(fixed_batch.dense, fixed_batch.sparse), fixed_batch.labels)
    trainer = _trainer(max_steps=40, limit_val_batches=2, num_sanity_val_steps=0)
    trainer.fit(model, train_dataloaders=_loader(fixed_batch, 40), val_dataloaders=movielens.val_dataloader())
    with torch.no_grad():
        after = F.binary_cross_entropy_with_logits(model(fixed_batch.dense, fixed_batch.sparse), fixed_batch.labels)
    assert trainer.global_step == 40
    assert after < 0.5 * before, (float(before), float(after))
    logged = set(trainer.callback_metrics)
    expected = {f"{stage}/{name}" for stage in ("train", "val") for name in ("auc", "acc", "ne")}
    assert expected | {"train/loss_step", "train/loss_epoch", "val/loss"} <= logged, logged
    assert float(trainer.callback_metrics["train/auc"]) > 0.9

    unseen = next(iter(movielens.val_dataloader()))  # on the overfitted batch the loss is ~1e-8: float32 noise
    results = trainer.test(model, dataloaders=_loader(unseen, 1), verbose=False)[0]
    assert set(results) == {"test/loss", "test/auc", "test/acc", "test/ne"}
    entropy = float(binary_entropy(unseen.labels.mean()))
    assert results["test/ne"] == pytest.approx(results["test/loss"] / entropy, rel=1e-4)

    probs = torch.cat(trainer.predict(model, dataloaders=_loader(fixed_batch, 2)))
    assert probs.shape == (2 * fixed_batch.batch_size,)
    assert bool(((probs >= 0) & (probs <= 1)).all())


def test_normalized_entropy_matches_hand_computation():
    torch.manual_seed(1)
    logits = [torch.randn(50) * 2, torch.randn(30) * 2]
    labels = [torch.bernoulli(torch.full((50,), 0.3)), torch.bernoulli(torch.full((30,), 0.3))]
    metric, from_probs = NormalizedEntropy(), NormalizedEntropy(from_logits=False)
    for x, y in zip(logits, labels):
        metric.update(x, y)
        from_probs.update(x.sigmoid(), y)
    x, y = torch.cat(logits).double().tolist(), torch.cat(labels).double().tolist()
    sigmoid = [1 / (1 + math.exp(-s)) for s in x]
    bce = -sum(t * math.log(q) + (1 - t) * math.log(1 - q) for q, t in zip(sigmoid, y))
    p = sum(y) / len(y)
    expected = (bce / len(y)) / -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-9)
    assert float(from_probs.compute()) == pytest.approx(expected, rel=1e-5)
    base_rate = NormalizedEntropy()
    base_rate.update(torch.full((80,), math.log(p / (1 - p))), torch.cat(labels))
    assert float(base_rate.compute()) == pytest.approx(1.0, rel=1e-9)  # predicting the base rate gives NE = 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dense_arch_layer_sizes": [64, 8]}, r"\[64, 8\]"),
        ({"embedding_dim": 32}, r"embedding_dim=32"),
        ({"over_arch_layer_sizes": [64, 2]}, r"\[64, 2\]"),
        ({"over_arch_layer_sizes": [1]}, r"\[1\]"),
        ({"dense_arch_layer_sizes": [0, 16]}, r"\[0, 16\]"),
        ({"num_dense": 0}, r"num_dense.*0"),
        ({"feature_names": ["a"]}, r"\['a'\]"),
        ({"auroc_thresholds": 1}, r"auroc_thresholds.*1"),
    ],
)
def test_bad_sizes_raise_value_error(kwargs, message):
    base = dict(table_sizes=[10, 20], feature_names=["a", "b"], num_dense=3)
    with pytest.raises(ValueError, match=message):
        DLRMClassifier(**{**base, **kwargs})


def test_checkpoint_round_trip(movielens, fixed_batch, tmp_path):
    model = _model(movielens, embedding_dim=8, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])
    trainer = _trainer(max_steps=3)
    trainer.fit(model, train_dataloaders=_loader(fixed_batch, 3))
    path = tmp_path / "dlrm.ckpt"
    trainer.save_checkpoint(path)
    loaded = DLRMClassifier.load_from_checkpoint(path)
    model.eval()
    loaded.eval()
    with torch.no_grad():
        expected = model(fixed_batch.dense, fixed_batch.sparse)
        got = loaded(fixed_batch.dense, fixed_batch.sparse)
    assert torch.equal(expected, got)
    assert loaded.hparams.feature_names == movielens.feature_names


def test_compressed_trained_tables_are_two_factors_and_their_checkpoint_loads(movielens, fixed_batch, tmp_path):
    from comera_lightning import BudgetConfig

    model = _model(movielens, embedding_dim=8, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])
    _trainer(max_steps=3).fit(model, train_dataloaders=_loader(fixed_batch, 3))  # "trained" dense
    collection = "model.sparse_arch.embedding_bag_collection"
    tensorize = TensorizeConfig(init="svd", target_modules=[collection], layer_config={collection: {"min_rows": 300}})
    compress = ComeraCallback(tensorize=tensorize, budget=BudgetConfig(compression=2))
    trainer = _trainer(max_steps=3, callbacks=[compress])
    trainer.fit(model, train_dataloaders=_loader(fixed_batch, 3))
    item = model.get_submodule(collection).embedding_bags["t_item_id"]
    assert item.row_modes == (item.num_embeddings, 1) and len(item.cores) == 2  # its truncated SVD's two factors
    path = tmp_path / "compressed.ckpt"
    trainer.save_checkpoint(path)
    loaded = DLRMClassifier.load_from_checkpoint(path)  # rebuilt from the record, not from init="svd"
    model.eval()
    loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(fixed_batch.dense, fixed_batch.sparse), model(fixed_batch.dense, fixed_batch.sparse))


def test_meta_embeddings_train_once_tensorized_and_are_refused_otherwise(movielens, fixed_batch):
    model = _model(movielens, meta_embeddings=True)
    with pytest.raises(ValueError, match="meta_embeddings=True.*ComeraCallback"):
        _trainer(max_steps=1).fit(model, train_dataloaders=_loader(fixed_batch, 1))
    callback = ComeraCallback(
        max_rank=4, target_modules=["model.sparse_arch.embedding_bag_collection"], early_steps=2, late_steps=1,
        tensorize=TensorizeConfig(layer_config={"model.sparse_arch.embedding_bag_collection": {"min_rows": 500}}),
    )
    model = _model(movielens, meta_embeddings=True)
    trainer = _trainer(max_steps=3, callbacks=[callback])
    trainer.fit(model, train_dataloaders=_loader(fixed_batch, 3))
    assert trainer.global_step == 3
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("name", ["dlrm.yaml", "dlrm_tiny.yaml"])
def test_configs_build_a_model(name):
    config = yaml.safe_load((CONFIGS / name).read_text())
    assert {"seed_everything", "trainer", "model", "data", "comera"} <= set(config)
    assert COMERA_KEYS <= set(config["comera"]) | set(config["comera"]["budget"]) and TENSORIZE_KEYS <= set(config["comera"]["tensorize"])
    assert config["model"]["class_path"] == "comera_lightning.models.dlrm.DLRMClassifier"
    assert "CSVLogger" in config["trainer"]["logger"]["class_path"]
    init_args = {k: v for k, v in config["model"]["init_args"].items() if k != "optimizer"}
    if name == "dlrm.yaml":
        assert config["data"]["init_args"]["table_sizes"] == CRITEO_KAGGLE_TABLE_SIZES
        assert init_args["embedding_dim"] == 128
    # The architecture is valid (built here with tiny tables: the Kaggle ones would take 17 GB).
    model = DLRMClassifier(table_sizes=[5] * 3, feature_names=["a", "b", "c"], num_dense=4, **init_args)
    names = dict(model.named_modules())
    for target in config["comera"]["tensorize"]["target_modules"]:
        assert target in names, target
