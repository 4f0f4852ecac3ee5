"""Checkpoint files that are either whole or absent, even when the process is killed mid-write.

Lightning writes a local checkpoint to a temporary file in the system's temporary directory and
moves it into place: on another filesystem the move is a copy (a kill leaves a truncated
``last.ckpt``), and a kill leaves the temporary file behind. :class:`AtomicCheckpointIO` writes
``.<name>.partial-<pid>`` next to the target, syncs it, and renames it over the target (atomic
within one directory on POSIX); partial files of dead processes are removed at the next save.
``ComeraCallback`` installs it when the strategy uses Lightning's default ``TorchCheckpointIO``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

__all__ = ["AtomicCheckpointIO", "partial_files"]

_PARTIAL = ".partial-"


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are atomic within the checkpoint's directory (remote ones: Lightning's)."""

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in partial_files(target.parent, dead_only=True):
            stale.unlink(missing_ok=True)
        partial = target.parent / f".{target.name}{_PARTIAL}{os.getpid()}"
        try:
            with open(partial, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        _fsync_directory(target.parent)


def partial_files(directory: str | Path, dead_only: bool = False) -> list[Path]:
    """The unfinished checkpoint files in ``directory`` (``dead_only``: of processes no longer running)."""
    found = []
    for path in Path(directory).glob(f".*{_PARTIAL}*"):
        pid = path.name.rsplit(_PARTIAL, 1)[-1]
        if not dead_only or not pid.isdigit() or not _running(int(pid)):
            found.append(path)
    return found


def _is_local(path: Any) -> bool:
    return isinstance(get_filesystem(str(path)), LocalFileSystem)


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
