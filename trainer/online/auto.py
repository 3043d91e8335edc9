"""``--placement auto``: a graph placement is kept only where it pays for itself, measured.

A graph placement saves rows that ranks fetch, but it is not free: window samples travel to
rank 0, placements are broadcast, rows migrate, samples are routed, replicas are flushed and
refreshed. On a stream with small vocabularies every rank touches most rows every step, the
partition has little to cut, and those costs can exceed the saving (graph sent 2-6x hash's bytes
on small real logs). An estimate from the window's remote rows leaves out the replica traffic
that decides it there, so the loop compares bytes the ranks actually send, on the same steps:

* What a placement changes is the embedding path's bytes (route, header, request, response,
  gradient, flush) plus the loop's window, placement and migration traffic. The dense
  all-reduce and the control round cost the same per step under any placement and are left out
  (counted, they would make the comparison depend on how full the steps were: a backlog read in
  full batches at start, a producer outpaced later).
* ``hash``: training starts on the hash placement, unrouted, as ``--placement hash`` would. Its
  embedding bytes per remote row fetched (the rows a rank's batch uses that it does not own)
  calibrate a price: hash's cost of a step is that price times the rows its batches would fetch
  under hash. The window fills meanwhile (its bytes are not hash's: ``--placement hash`` sends
  no window) and the cold-start partition runs as in online mode.
* ``trial``: once the graph placement is in force, the bytes sent over two repartition
  intervals (window, placements, migrations and routing included) are compared with the price
  times the rows hash would have fetched for the same batches (each rank counts them on the
  batch it read). Two, because the first interval after a cold start is a placement's worst: it
  was computed from the warm-up alone, and the window grows and the incremental passes improve
  it after (measured on the default stream, 2 ranks, intervals of 12,000 records: 0.88 of
  hash's bytes over the first two intervals, 0.76-0.78 over each one after; with intervals of
  8,000, 0.94 over the first two). Graph is
  kept when it costs at most ``1 - margin`` of that; otherwise the rows go back to their hash
  owners, routing and the window feed stop, and hash stays (``rest``).
* ``graph``: the comparison runs again every interval; if graph stops paying (the stream
  changed), the placement goes back to hash.
* ``rest``: after a rest that doubles with each failed try (4 intervals, then 8, up to 64), the
  window feed starts again and a new cold-start partition is tried (back to ``hash``).

Every rank holds one :class:`AutoPlacement` fed the same control vector sums, so every rank
takes every decision at the same step without a message of its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["AutoPlacement", "Tally"]

log = logging.getLogger(__name__)

# Rest before the next try of a graph placement, in trial lengths: doubled after each failed
# try, up to the last.
_REST_FIRST, _REST_MAX = 4, 64


@dataclass
class Tally:
    """What all ranks sent and trained over some steps, and the rows hash fetches for them."""

    bytes: int = 0
    hash_rows: int = 0
    samples: int = 0

    def add(self, nbytes: int, hash_rows: int, samples: int) -> None:
        """Count one step."""
        self.bytes += nbytes
        self.hash_rows += hash_rows
        self.samples += samples


class AutoPlacement:
    """Which placement ``--placement auto`` keeps, decided from measured bytes (every rank).

    Args:
        trial_records: Records a graph placement is measured over (one repartition interval;
            twice that for the first measure after a cold start).
        margin: Graph is kept when it costs at most ``1 - margin`` of hash's bytes.
        graph: A graph placement is in force already (a resumed run): it is kept until hash's
            price was measured (after a first move back, never before).
        records: Records read when the loop starts.
    """

    def __init__(self, trial_records: int, margin: float = 0.03, *, graph: bool = False,
                 records: int = 0) -> None:
        if trial_records < 1 or not 0.0 <= margin < 1.0:
            raise ValueError("trial_records >= 1 and margin in [0, 1) required")
        self.trial_records, self.margin = trial_records, margin
        self.state = "graph" if graph else "hash"
        self.hash, self.graph = Tally(), Tally()
        self.decisions: list[dict[str, object]] = []
        self._since = records
        self._rest = _REST_FIRST
        self._switching = False

    @property
    def feeding(self) -> bool:
        """Whether the window feed runs (and rank 0 may start partitions)."""
        return self.state != "rest"

    @property
    def routes(self) -> bool:
        """Whether samples are routed to the ranks holding their rows."""
        return self.state in ("trial", "graph") or self._switching

    @property
    def on_hash(self) -> bool:
        """Whether the hash placement is in force, unrouted (``rows_not_held`` are then the
        rows hash fetches)."""
        return not self.routes

    @property
    def price(self) -> float | None:
        """Hash's embedding bytes per row fetched, as measured (None: not yet)."""
        return self.hash.bytes / self.hash.hash_rows if self.hash.hash_rows else None

    def on_graph(self) -> None:
        """A graph placement was received: its migration starts; the trial starts when it ends."""
        if self.state == "hash":
            self._switching = True

    def on_migrated(self, records: int) -> None:
        """A migration finished: the first graph placement is in force, its trial starts."""
        if self._switching:
            self._switching = False
            self.state, self.graph, self._since = "trial", Tally(), records

    def observe(self, *, records: int, samples: int, embedding_bytes: int, loop_bytes: int,
                hash_rows: int, migrating: bool) -> str | None:
        """One control round, summed over ranks: the samples trained in the previous step, the
        embedding path's and the loop's (window, placements, migrations) bytes sent since the
        previous round, and the rows hash fetches (fetched, on hash; would fetch, for the
        batches read, on graph). On hash the loop's bytes are left out: they are the window
        filling for the next try, which ``--placement hash`` would not send.

        Returns:
            ``"hash"`` when the placement must go back to hash now, ``"graph"`` when a rest
            ended and a graph placement is to be tried again, or None.
        """
        if self.state in ("hash", "rest"):
            if not migrating and not self._switching:
                self.hash.add(embedding_bytes, hash_rows, samples)
            if self.state == "rest" and records - self._since >= self._rest * self.trial_records:
                self.state, self._rest, self._since = "hash", min(2 * self._rest, _REST_MAX), records
                self._decide("try graph", records)
                return "graph"
            return None
        self.graph.add(embedding_bytes + loop_bytes, hash_rows, samples)
        length = self.trial_records * (2 if self.state == "trial" else 1)
        if records - self._since < length or migrating:
            return None
        keep = self._graph_pays()
        self._decide("keep graph" if keep else "back to hash", records)
        self._since = records
        if keep:
            if self.state == "trial":
                self._rest = _REST_FIRST
            self.state, self.graph = "graph", Tally()
            return None
        self.state, self.hash, self.graph = "rest", Tally(), Tally()
        return "hash"

    def report(self, records: int) -> dict[str, object]:
        """Where auto stands after ``records`` records: ``state``, every decision, the placement
        ``in_force`` (graph while on trial or kept) and the one chosen (``kind``): ``graph``,
        ``hash``, or ``undecided`` while a graph placement is on trial or none was tried yet
        (a run that ends then never compared the two: ``records_to_decision`` says how many
        more records its trial needed, None before a trial)."""
        verdicts = [d for d in self.decisions if d["decision"] != "try graph"]
        kind = {"graph": "graph", "rest": "hash", "trial": "undecided"}.get(
            self.state, "hash" if verdicts else "undecided")
        left = max(2 * self.trial_records - (records - self._since), 0) \
            if self.state == "trial" else None
        return {"state": self.state, "decisions": list(self.decisions),
                "in_force": "graph" if self.state in ("trial", "graph") else "hash",
                "kind": kind, "records_to_decision": left}

    def hash_estimate(self) -> float | None:
        """Bytes hash would have sent over the graph steps measured (None: no price yet)."""
        price = self.price
        return None if price is None else price * self.graph.hash_rows

    def _graph_pays(self) -> bool:
        estimate = self.hash_estimate()
        if estimate is None:  # nothing to compare with (resumed on graph): keep it
            return True
        return self.graph.bytes <= (1.0 - self.margin) * estimate

    def _decide(self, what: str, records: int) -> None:
        g, estimate = self.graph, self.hash_estimate()
        per = lambda b: None if b is None or not g.samples else round(b / g.samples, 1)  # noqa: E731
        entry = {"decision": what, "records": records,
                 "graph_bytes_per_sample": per(g.bytes) if g.samples else None,
                 "hash_bytes_per_sample": per(estimate),
                 "hash_bytes_per_row": None if self.price is None else round(self.price, 1)}
        self.decisions.append(entry)
        log.info("placement auto at record %d: %s (placement-dependent bytes per sample: graph "
                 "%s, hash %s for the same batches)", records, what,
                 entry["graph_bytes_per_sample"] or "-", entry["hash_bytes_per_sample"] or "-")
