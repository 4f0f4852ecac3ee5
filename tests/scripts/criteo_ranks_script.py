"""Two gloo processes × two DataLoader workers read Criteo files; each rank writes the ids and byte spans it read.

Usage: ``criteo_ranks_script.py OUT FILE...``; writes ``OUT/rank{r}.json``.
"""

import json
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, get_worker_info

from comera_lightning.data.criteo.tsv import CriteoIterableDataset


class WorkerReads(CriteoIterableDataset):
    """What this reader reads: ("block", file name, first byte, end byte) per block, then ("ids", worker, C1 ids) per batch."""

    def __iter__(self):
        for block in self.iter_blocks():
            yield "block", block.path.name, block.offset, block.offset + len(block.data)
        for batch in super().__iter__():
            yield "ids", get_worker_info().id, batch.sparse["cat_0"].values().tolist()


def run(rank: int, out: Path, files: list[str], port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    ids: dict[str, list[int]] = {}
    blocks = []
    for kind, *read in DataLoader(WorkerReads(files, 16, [2**31] * 26, block_bytes=2048), batch_size=None, num_workers=2):
        if kind == "block":
            blocks.append(read)
        else:
            ids.setdefault(str(read[0]), []).extend(read[1])
    (out / f"rank{rank}.json").write_text(json.dumps({"ids": ids, "blocks": blocks}))
    dist.destroy_process_group()


def free_port() -> int:
    """``$MASTER_PORT`` when the test set one (tests/conftest.py: one per xdist worker), else any free port."""
    if os.environ.get("MASTER_PORT"):
        return int(os.environ["MASTER_PORT"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    # fork: the ranks start with this process's imports instead of importing torch and the package again.
    torch.multiprocessing.start_processes(run, args=(Path(sys.argv[1]), sys.argv[2:], free_port()), nprocs=2,
                                          start_method="fork")
