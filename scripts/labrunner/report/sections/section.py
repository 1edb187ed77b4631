"""The Section interface: what each part of report.md and report.html gives the build, and the report
every section reads."""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from labrunner.report import serialization
from labrunner.report.compare import Comparison, Group, against_baseline
from labrunner.report.document import Block, Image
from labrunner.report.handshakes import HandshakeCase
from labrunner.report.payload import PayloadRow
from labrunner.report.runs import Run

CHARTS_DIR = "charts"  # in the run's directory: the report's PNGs


@dataclass(frozen=True)
class Report:
    """What a section may read: the run, the run it is compared with, the payload table and the
    serialization benchmark's file."""

    run: Run
    baseline: Run | None = None
    payload_rows: tuple[PayloadRow, ...] = ()
    payload_note: str = ""  # why the payload table was measured now instead of read from the run
    bench: Any = None  # serialization.json as read; None when the run has none
    handshakes: tuple[HandshakeCase, ...] = ()  # handshakes.json's cases; none when the run has none

    @property
    def charts_dir(self) -> Path:
        return self.run.path / CHARTS_DIR

    @cached_property
    def cases(self) -> tuple[serialization.Case, ...]:
        return tuple(serialization.cases_from_document(self.bench))

    @cached_property
    def changes(self) -> dict[str, Comparison]:
        """Each group against the baseline's group of the same id; empty without a baseline."""
        return against_baseline(self.run.groups, self.baseline.groups) if self.baseline else {}


def groups_of(report: Report, kind: str) -> list[Group]:
    """The run's groups of one kind (compare.THROUGHPUT, SEQUENTIAL, CAPACITY)."""
    return [g for g in report.run.groups if g.kind == kind]


def no_charts(report: Report) -> list[Block]:
    return []


def always(report: Report) -> bool:
    return True


@dataclass(frozen=True)
class Section:
    """One section: its title (the heading its blocks open with), whether it applies to a report, its
    blocks (heading and body, the same for Markdown and HTML) and its charts, which the Charts section
    shows in the sections' order."""

    title: str
    applies: Callable[[Report], bool]
    blocks: Callable[[Report], list[Block]]
    charts: Callable[[Report], list[Block]] = no_charts


def figures(drawn: Iterable[tuple[Path | None, str, str]]) -> list[Block]:
    """(path, alt text, caption) of each chart as an image; a chart without data (no path) is left out."""
    return [Image(path, alt, f"{alt}. {caption}.") for path, alt, caption in drawn if path is not None]
