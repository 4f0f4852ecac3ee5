"""The data package and its dataset folders: their public names; TorchRec imported only when click logs are used."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["comera_lightning.data", "comera_lightning.data.pairs", "comera_lightning.data.code",
                                     "comera_lightning.data.text", "comera_lightning.data.criteo",
                                     "comera_lightning.data.movielens"])
def test_each_data_package_has_its_public_names(package: str) -> None:
    if package.rsplit(".", 1)[-1] in ("criteo", "movielens"):
        pytest.importorskip("torchrec")
    loaded = importlib.import_module(package)
    assert loaded.__all__ and not [name for name in loaded.__all__ if not hasattr(loaded, name)]


def test_package_import_does_not_import_torchrec() -> None:
    code = "import sys, comera_lightning.data as d; assert 'torchrec' not in sys.modules; d.ClickBatch; print('ok')"
    if importlib.util.find_spec("torchrec") is None:
        code = "import sys, comera_lightning.data as d; assert 'torchrec' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_click_logs_without_torchrec_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchrec.sparse.jagged_tensor", None)  # `import` of it raises ImportError
    monkeypatch.setitem(sys.modules, "torchrec.modules.embedding_configs", None)
    monkeypatch.delitem(sys.modules, "comera_lightning.data.click_logs", raising=False)
    with pytest.raises(ImportError, match=r"click-log data.*needs torchrec: pip install 'comera_lightning\[recsys\]'"):
        importlib.import_module("comera_lightning.data.click_logs")
