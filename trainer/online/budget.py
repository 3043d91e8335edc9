"""The record budget of a run (``--max-records``), counted the same way on every rank."""

from __future__ import annotations

__all__ = ["RecordBudget", "budget_share"]


def budget_share(remaining: int, rank: int, world: int, turn: int) -> int:
    """Records ``rank`` may read of the ``remaining`` ones: an equal share, and the odd ones
    in turn. ``turn`` must advance every round, step or not: a round in which nobody read is
    no step, and a rank whose partitions are drained must not keep the odd record for ever."""
    extra = (rank + turn) % world < remaining % world
    return remaining // world + int(extra)


class RecordBudget:
    """Records read over all ranks (the control vector's sum), against ``--max-records``.

    Args:
        limit: Records the run may read over all ranks (0: no limit).
        rank: This rank.
        world: Ranks in the job.
        records: Records read before this run (a resumed run counts on from its checkpoint).
    """

    def __init__(self, limit: int, rank: int, world: int, records: int = 0) -> None:
        self.limit, self.rank, self.world = limit, rank, world
        self.records = records
        self._rounds = 0

    def count(self, records: int) -> None:
        """Count one control round's records (the job's, the same number on every rank)."""
        self.records += records
        self._rounds += 1

    @property
    def spent(self) -> bool:
        """The limit is reached."""
        return bool(self.limit) and self.records >= self.limit

    def read_cap(self) -> int | None:
        """Most records this rank may read this step (None: no limit)."""
        if not self.limit:
            return None
        return budget_share(max(self.limit - self.records, 0), self.rank, self.world,
                            self._rounds)
