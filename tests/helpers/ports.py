"""A MASTER_PORT for each test that no other pytest-xdist worker hands out (tests/conftest.py sets it).

Each worker (``gw0``, ``gw1``, ...; a plain run counts as ``gw0``) draws from its own block of ports
below Linux's ephemeral range (32768-60999), where ``bind(0)`` (Lightning's own choice when
MASTER_PORT is unset) and outgoing connections take theirs. The start within a block is random, so
two test sessions on one host (two checkouts) rarely meet; a port still bound or in TIME_WAIT is skipped.
"""

from __future__ import annotations

import os
import random
import socket

BASE = 20000
BLOCK = 500  # 24 workers fit below 32000
BLOCKS = 24


def worker_index() -> int:
    """This pytest-xdist worker's number (0 in a plain run)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) % BLOCKS if name[2:].isdigit() else 0


_offset = random.SystemRandom().randrange(BLOCK)  # not the seeded generator the tests reset


def free_port() -> int:
    """The next port of this worker's block that nothing is bound to now."""
    global _offset
    start = BASE + worker_index() * BLOCK
    for _ in range(BLOCK):
        _offset = (_offset + 1) % BLOCK
        port = start + _offset
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {start}-{start + BLOCK - 1}")
