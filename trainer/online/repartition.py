"""Rank 0's repartitioning: when a new placement is due, and computing it beside training.

The placement is computed in the partitioner process (:class:`PartitionerProcess`), waited on by
one thread so that training never waits for it and its numpy and METIS work never holds the
training process's GIL. A placement is due

* at cold start, once ``--warmup`` records (or one repartition interval) were read: a full
  METIS partition of the window;
* after that, every repartition interval (records or seconds), or earlier on drift
  (:class:`DriftDetector`): an incremental pass over the placement in force.

Only rank 0 holds a :class:`Repartitioner`; the others learn its decisions from the control
vector.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

import numpy as np

from hetgmp.partitioner import PartitionConfig, PassReport, Placement
from hetgmp.trainer.online.config import Interval
from hetgmp.trainer.online.drift import DriftDetector
from hetgmp.trainer.online.partition_process import PartitionerProcess

__all__ = ["PlacementResult", "Repartitioner"]

log = logging.getLogger(__name__)

# What the partitioner hands back: the placement, seconds it took, its kind ("full" or
# "incremental") and what an incremental pass moved.
PlacementResult = tuple[Placement, float, str, PassReport | None]


class Repartitioner:
    """When to repartition, and the partition under way (rank 0).

    Args:
        fields: Ids per sample.
        window: Samples in the partitioner's access window.
        config: Partitioner settings.
        interval: The repartition interval.
        warmup: Records before the first placement (0: one interval).
        drift_threshold: Rise of remote rows per sample that repartitions early (0: off).
        computed: A placement computed from the stream is in force already (a resumed run:
            it is repaired incrementally, not replaced).
        records: Records read when the loop starts.
        now: Monotonic time when the loop starts.
    """

    def __init__(self, fields: int, window: int, config: PartitionConfig, interval: Interval,
                 warmup: int, drift_threshold: float, *, computed: bool, records: int,
                 now: float) -> None:
        self.interval, self.warmup = interval, warmup
        self.drift = DriftDetector(drift_threshold)
        self.computed = computed
        self._since = (records, now)
        self._process = PartitionerProcess(fields, window, config)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="hetgmp-partitioner")
        self._future: Future[PlacementResult] | None = None

    @property
    def busy(self) -> bool:
        """A partition is under way (or done and not yet taken)."""
        return self._future is not None

    @property
    def ready(self) -> bool:
        """A placement is computed and waits to be taken."""
        return self._future is not None and self._future.done()

    def due(self, records: int, now: float, migrating: bool) -> bool | str:
        """Whether to start a partition: False, or why (``"warmup"``, ``"interval"``,
        ``"drift"``); ``migrating``: a migration is in progress, or no partition may start."""
        if self.busy or migrating:
            return False
        read, seconds = records - self._since[0], now - self._since[1]
        if not self.computed:
            warm = self.warmup or self.interval.count
            if warm:
                return "warmup" if read >= warm else False
            return "warmup" if self.interval.due(read, seconds) else False
        if self.interval.due(read, seconds):
            return "interval"
        if self.drift.drifted():
            log.info("drift: remote rows per sample %.3f, %.0f%% above the %.3f after the last "
                     "placement: repartitioning early", self.drift.level,
                     100 * self.drift.rise, self.drift.baseline)
            return "drift"
        return False

    def observe(self, remote_rows_per_sample: float, migrating: bool) -> None:
        """One step's remote rows per sample, for drift detection."""
        self.drift.observe(remote_rows_per_sample,
                           settled=self.computed and not migrating and not self.busy)

    def start(self, parts: list[tuple[np.ndarray, np.ndarray]], current: Placement, records: int,
              now: float) -> str:
        """Roll ``parts`` into the window and compute the next placement beside training;
        the kind of partition started."""
        kind = "incremental" if self.computed else "full"
        version = current.version
        self._since = (records, now)
        self.drift.reset()
        # The thread only waits on the partitioner process (no GIL held while it waits).
        self._future = self._executor.submit(self._process.partition, parts,
                                             current if self.computed else None, version)
        self.computed = True
        return kind

    def cold(self, records: int, now: float) -> None:
        """Start over as at cold start (``--placement auto`` went back to hash): a partition
        under way is dropped, and the next one is a full one, due a warm-up after now."""
        if self._future is not None:
            self._future.cancel()  # one already running ends in the thread, unread
            self._future = None
        self.computed = False
        self._since = (records, now)
        self.drift.reset()

    def take(self) -> PlacementResult:
        """The placement computed (blocks until it is; raises what the partitioner raised)."""
        assert self._future is not None
        future, self._future = self._future, None
        return future.result()

    def close(self) -> None:
        """Stop the partitioner (a placement still being computed is dropped)."""
        self._process.close()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Repartitioner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
