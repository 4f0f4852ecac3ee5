"""benchmarks/scaling/criteo_reader.py on a small file: every system reads every row, the JSON has no paths."""

import importlib
import json

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")
pytest.importorskip("iopath")


def test_every_system_reads_every_row_and_the_result_names_no_path(tmp_path):
    bench = importlib.import_module("benchmarks.scaling.criteo_reader")
    out = tmp_path / "criteo_reader.json"
    result = bench.main(["--rows", "3000", "--rounds", "1", "--batch", "512", "--out", str(out)])
    assert set(result["systems"]) == {"comera", "comera_per_line", "comera_2_workers", "comera_convert",
                                      "comera_npy_batches", "torchrec_tsv_stream", "torchrec_tsv_to_npys",
                                      "torchrec_npy_batches"}
    assert all(s["rows_per_s_median"] > 0 for s in result["systems"].values())
    assert "/" not in json.dumps(result["machine"]) and str(tmp_path) not in out.read_text()


def test_ids_and_labels_match_torchrec_own_conversion(tmp_path):
    from comera_lightning.data.criteo.tsv import CriteoIterableDataset

    bench = importlib.import_module("benchmarks.scaling.criteo_reader")
    day = tmp_path / "day_0"
    bench.write_synthetic_day(day, 1500, seed=3)
    assert bench.comera_rows(day, 256) == bench.comera_rows(day, 256, vectorised=False) == 1500
    assert bench.torchrec_to_npys(day, tmp_path) == bench.torchrec_stream_rows(day) == 1500
    batches = list(CriteoIterableDataset([day], 256, bench.TABLE_SIZES))
    ids = torch.cat([torch.stack([b.sparse[f"cat_{c}"].values() for c in range(26)], 1) for b in batches])
    theirs = torch.from_numpy(np.load(tmp_path / "day_0_sparse.npy")) % torch.tensor(bench.TABLE_SIZES)
    assert torch.equal(ids, theirs)  # TorchRec maps an empty id to 0, as we do
    labels = torch.cat([b.labels for b in batches])
    assert torch.equal(labels, torch.from_numpy(np.load(tmp_path / "day_0_labels.npy")).flatten().float())


def test_unknown_system_is_refused():
    bench = importlib.import_module("benchmarks.scaling.criteo_reader")
    with pytest.raises(SystemExit):
        bench.main(["--rows", "10", "--systems", "comera", "torchrec_fast"])
