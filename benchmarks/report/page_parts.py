"""What a results page is: a ``Page`` of sections (``Section``), each a table rendered from ``benchmarks/results/``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Section:
    """A table: ``source`` (relative to ``benchmarks/results/``) rendered by ``render`` (``module:function``); a
    tuple of sources is rendered from ``{source: result}``."""

    heading: str
    source: str | tuple[str, ...]
    render: str
    text: str = ""

    @property
    def sources(self) -> list[str]:
        """The section's files, one or several."""
        return [self.source] if isinstance(self.source, str) else list(self.source)


@dataclass(frozen=True)
class Page:
    """A results page ``docs/results/<name>.md`` answering ``question``."""

    name: str
    title: str
    question: str
    sections: list[Section] = field(default_factory=list)


RACE = "benchmarks.quality.report:markdown_table"
OURS = "benchmarks.report.tables"
GPU = "benchmarks.report.tables_gpu"
SCALING = "benchmarks.report.tables_scaling"


def seeded(stem: str, variants: dict[str, int]) -> tuple[str, ...]:
    """The result files of ``stem`` + each variant, one per seed it ran (``<stem><variant>[_seed<N>].json``)."""
    return tuple(f"{stem}{variant}{f'_seed{seed}' if seed else ''}.json" for variant, seeds in variants.items()
                 for seed in range(seeds))
