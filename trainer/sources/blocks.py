"""A source whose batches carry a column of ids for each block of each field's rows.

Tables of several widths store their rows in blocks of one width
(:mod:`hetgmp.trainer.model.widths`); a rank's batches are expanded where they leave the
source, so that everything after it (the access window the partitioner reads, routing, the
trainer, held-out scoring) sees every block a record reads, and places, routes and counts the
blocks as it does rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hetgmp.streaming import ClickBatch
from hetgmp.trainer.model import Widths
from hetgmp.trainer.sources.base import Source

__all__ = ["BlockSource", "with_blocks"]


class BlockSource(Source):
    """``source`` with its batches expanded by ``widths`` (everything else is the source's)."""

    def __init__(self, source: Source, widths: Widths) -> None:
        self.source, self.widths = source, widths
        self.schema = source.schema

    def next_batch(self, cap: int | None = None) -> ClickBatch:
        return self.widths.expand(self.source.next_batch(cap))

    @property
    def exhausted(self) -> bool:
        return self.source.exhausted

    @property
    def topic(self) -> str | None:
        return self.source.topic

    @property
    def topic_id(self) -> str | None:
        return self.source.topic_id

    @property
    def passes_done(self) -> int:  # type: ignore[override]
        return self.source.passes_done

    def upcoming_ids(self) -> np.ndarray:
        # A hint for reading rows ahead: the first blocks' ids (the rest are read on demand).
        return self.source.upcoming_ids()

    def mark_trained(self) -> None:
        self.source.mark_trained()

    def snapshot(self) -> dict[int, int]:
        return self.source.snapshot()

    def prepare_commit(self) -> None:
        self.source.prepare_commit()

    def commit(self, offsets: Mapping[int, int]) -> bool:
        return self.source.commit(offsets)

    def collectors(self, labels: Mapping[str, str]) -> list[Any]:
        return self.source.collectors(labels)

    def caught_up(self) -> bool:
        return self.source.caught_up()

    def report(self) -> dict[str, int]:
        return self.source.report()

    def close(self) -> None:
        self.source.close()

    def __getattr__(self, name: str) -> Any:
        # What a particular source offers beyond the contract (a Kafka shard's consumer).
        return getattr(self.source, name)


def with_blocks(source: Source, widths: Widths) -> Source:
    """``source`` itself when every row is one block, else its batches expanded."""
    return source if widths.one_block else BlockSource(source, widths)
