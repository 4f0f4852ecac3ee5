"""GraphCache: which batch keys warm up, get captured, replay or stay eager, and when every graph must go.

Plain Python, no CUDA: the decisions of CUDAGraphStrategy that tests check on CPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from typing import Any

__all__ = ["CAPTURE", "EAGER", "REPLAY", "WARMUP", "GraphCache"]

EAGER, WARMUP, CAPTURE, REPLAY = "eager", "warmup", "capture", "replay"


class GraphCache:
    """Graphs by batch key, the memory pool they share, and the *signature* they were captured under.

    A key is captured after ``warmup_steps`` eager steps with it, while fewer than ``max_graphs``
    graphs exist. The signature names what a captured step froze (parameter identities and
    shapes, optimizer hyper-parameters, the training stage...): :meth:`follow` drops every graph
    when it changed, and nothing when it did not (a prune that removed nothing). All graphs since
    the last invalidation share one memory pool (``pool``, set by whoever captures).
    """

    def __init__(self, warmup_steps: int = 3, max_graphs: int = 8) -> None:
        for name, value in (("warmup_steps", warmup_steps), ("max_graphs", max_graphs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        self.warmup_steps, self.max_graphs = warmup_steps, max_graphs
        self.graphs: dict[Hashable, Any] = {}
        self.warm: Counter = Counter()
        self.pool: Any = None
        self.signature: dict[str, Any] | None = None
        self.captures = 0
        self.invalidations = 0
        self.replays = 0

    def plan(self, key: Hashable) -> str:
        """What the next step with ``key`` does: ``"replay"``, ``"warmup"``, ``"capture"`` or ``"eager"`` (cache full)."""
        if key in self.graphs:
            return REPLAY
        if self.warm[key] < self.warmup_steps:
            return WARMUP
        return CAPTURE if len(self.graphs) < self.max_graphs else EAGER

    def warmed(self, key: Hashable) -> None:
        """Count one eager warm-up step with ``key``."""
        self.warm[key] += 1

    def store(self, key: Hashable, graph: Any) -> None:
        """Keep the graph captured for ``key``."""
        self.graphs[key] = graph
        self.captures += 1

    def replayed(self) -> None:
        """Count one replay (of any key)."""
        self.replays += 1

    def follow(self, signature: Mapping[str, Any]) -> list[str]:
        """Take ``signature`` as the current one; returns the names that changed, after dropping the graphs if any did."""
        before, self.signature = self.signature, dict(signature)
        if before is None:
            return []
        changed = sorted(name for name in before.keys() | signature.keys() if before.get(name) != signature.get(name))
        if changed and (self.graphs or self.warm):
            self.invalidate()
        return changed

    def invalidate(self) -> None:
        """Drop every graph, their pool and the warm-up counts (what they froze changed); counted in ``invalidations``."""
        self.clear()
        self.invalidations += 1

    def clear(self) -> None:
        """Drop every graph, their pool and the warm-up counts (training ended, or graphs were turned off)."""
        self.graphs.clear()
        self.warm.clear()
        self.pool = None
