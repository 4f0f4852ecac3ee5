"""The cli tests never reach W&B and keep tokenizers in one cache per session."""

import pytest


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("COMERA_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "comera_cache"))
