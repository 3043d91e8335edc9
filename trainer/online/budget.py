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
        run_limit: Records this run may read over all ranks (``--records`` on Kafka; 0: no
            limit of its own), whatever came before.
    """

    def __init__(self, limit: int, rank: int, world: int, records: int = 0,
                 run_limit: int = 0) -> None:
        self.limit, self.rank, self.world = limit, rank, world
        self.records = records
        self.run_limit, self._run_start = run_limit, records
        self._rounds = 0

    def count(self, records: int) -> None:
        """Count one control round's records (the job's, the same number on every rank)."""
        self.records += records
        self._rounds += 1

    def _remaining(self) -> int | None:
        left = [self.limit - self.records] if self.limit else []
        if self.run_limit:
            left.append(self.run_limit - (self.records - self._run_start))
        return max(min(left), 0) if left else None

    @property
    def spent(self) -> bool:
        """The limit is reached."""
        return self._remaining() == 0

    def read_cap(self) -> int | None:
        """Most records this rank may read this step (None: no limit)."""
        left = self._remaining()
        if left is None:
            return None
        return budget_share(left, self.rank, self.world, self._rounds)
