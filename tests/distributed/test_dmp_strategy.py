"""DLRM under TorchRec's DistributedModelParallel inside Lightning (TorchRecDMPStrategy), 2 gloo processes on CPU.

Three TT tables (replicated, pruned by ComeraCallback) and one dense table sharded table-wise by
TorchRec's planner: both ranks must train, prune identically, checkpoint one plain file (the sharded
table and its fused-optimizer state gathered whole) and resume from it.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchrec")  # the click-log data and the DLRM are built on TorchRec

from comera_lightning.data.click_logs import ClickBatch, kjt_from_id_matrix  # noqa: E402
from tests.helpers.paths import ROOT, SCRIPTS  # noqa: E402


def run(out: Path, mode: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, str(SCRIPTS / "dmp_script.py"), str(out), mode], capture_output=True, text=True,
                          env=env, timeout=600, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_click_batch_is_torchrec_pipelineable_batch():
    from torchrec.datasets.utils import Batch
    from torchrec.streamable import Pipelineable

    batch = ClickBatch(torch.zeros(2, 3), kjt_from_id_matrix(["a"], torch.tensor([[1], [2]])), torch.ones(2))
    assert isinstance(batch, Batch) and isinstance(batch, Pipelineable)
    assert batch.dense is batch.dense_features and batch.sparse is batch.sparse_features
    moved = batch.to("cpu")
    assert isinstance(moved, ClickBatch) and moved.batch_size == 2
    with pytest.raises(TypeError, match="both 'dense'"):
        ClickBatch(torch.zeros(2, 3), batch.sparse, batch.labels, dense_features=torch.ones(2, 3))


def test_dlrm_under_dmp_prunes_identically_checkpoints_and_resumes(tmp_path):
    first, second = run(tmp_path, "fit")
    assert first["step"] == second["step"] == 6
    assert first["collection"] == "ShardableEmbeddingBagCollection"
    assert first["sharded"] == "ShardedEmbeddingBagCollection" and "table_wise" in first["plan"]
    assert first["prunes"] == second["prunes"] >= 4
    assert first["ranks"] == second["ranks"] and len(first["ranks"]) == 3
    for name, value in first["replicated"].items():
        assert torch.equal(value, second["replicated"][name]), name
    owned = [t for rec in (first, second) for t in rec["dense_table"] if t.numel()]
    assert len(owned) == 1 and owned[0].shape == (64, 8), "the dense table lives on exactly one rank"
    gathered = first["full_state"]["model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_3.weight"]
    assert torch.equal(gathered, owned[0]), "the checkpoint holds the whole sharded table under its unsharded key"
    assert first["test"] and first["test"] == second["test"]

    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert torch.equal(checkpoint["state_dict"]["model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_3.weight"], gathered)
    momentum = checkpoint["torchrec_fused_optimizer"]["state"]
    assert any(v.abs().sum() > 0 for state in momentum.values() for v in state.values()), "fused optimizer state saved"

    resumed = run(tmp_path, "resume")
    assert resumed[0]["step"] == resumed[1]["step"] == 10
    assert resumed[0]["ranks"] == resumed[1]["ranks"]
    assert resumed[0]["prunes"] == first["prunes"] + 4
    for name, value in resumed[0]["replicated"].items():
        assert torch.equal(value, resumed[1]["replicated"][name]), name


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"sparse_optimizer": "adamw"}, "sparse_optimizer='adamw' is not one of"),
     ({"sparse_lr": 0.0}, "sparse_lr must be positive"),
     ({"sharding_types": ["table_wize"]}, "sharding_types"),
     ({"sharding_types": []}, "non-empty list")],
)
def test_dmp_strategy_names_bad_arguments(kwargs, message):
    from comera_lightning.distributed import TorchRecDMPStrategy

    with pytest.raises(ValueError, match=message):
        TorchRecDMPStrategy(**kwargs)


@pytest.mark.slow  # a second 2-process DMP run (40 s); the one above stays in the default run
def test_cli_selects_the_strategy_by_its_short_name(tmp_path):
    cli = [sys.executable, "-m", "comera_lightning", "fit", "--config", str(ROOT / "configs" / "dlrm_tiny.yaml"),
           "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "torchrec_dmp",
           "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"]
    done = subprocess.run(cli, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"},
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    (last,) = tmp_path.glob("logs/dlrm_tiny/version_0/checkpoints/last.ckpt")
    checkpoint = torch.load(last, weights_only=False, map_location="cpu")
    assert checkpoint["global_step"] == 3 and "torchrec_fused_optimizer" in checkpoint
