"""`PairSplit`: one split of a sentence-pair corpus as parallel lists of texts and label ids."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PairSplit"]


@dataclass
class PairSplit:
    """One split of a sentence-pair corpus: parallel lists of first texts, second texts and label ids."""

    text_a: list[str] = field(default_factory=list)
    text_b: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)

    def append(self, text_a: str, text_b: str, label: int) -> None:
        """Add one example."""
        self.text_a.append(text_a)
        self.text_b.append(text_b)
        self.labels.append(label)

    def head(self, limit: int | None) -> PairSplit:
        """Return the first `limit` examples (all of them when `limit` is None)."""
        if limit is None or limit >= len(self):
            return self
        return PairSplit(self.text_a[:limit], self.text_b[:limit], self.labels[:limit])
