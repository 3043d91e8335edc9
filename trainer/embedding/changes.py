"""What :class:`~hetgmp.trainer.embedding.store.EmbeddingStore` tells about its changes: to the
model delta log (rows changed since their last publish, tombstones of evicted rows) and to
checkpoints (rows changed since the last checkpoint, and ids removed since then).

Two marks a row, kept apart because the two readers run on their own schedules:

* ``_changed``: the value changed since the row was last published (:meth:`Changes.changes`).
  Rows moved in by a migration count as changed (their new owner publishes them); rows restored
  from a checkpoint do not (the checkpoint holds them).
* ``_unsaved``: the row (value, optimizer state or version) changed, was created, or moved in
  since the last checkpoint (:meth:`Changes.saved_rows`). A checkpoint of the changes holds
  these rows and the ids removed since the last one (idle rows dropped by eviction); a row
  that left by a migration is in its new owner's changes.

A spilled row keeps both marks (``_dirty``: the ids of those due for the delta log; the second
as the row's mark on disk, see :mod:`~hetgmp.trainer.embedding.spill`), read back with the row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from hetgmp.trainer.embedding.device_index import DeviceIndex
from hetgmp.trainer.embedding.tier import DiskTier

__all__ = ["Changes"]

Ids = torch.Tensor | np.ndarray
Rows = tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]


class Changes:
    """The delta log's and checkpoints' view of a store's changes (a mixin of the store)."""

    _index: DeviceIndex
    _values: torch.Tensor
    _state: torch.Tensor
    _version: torch.Tensor
    _changed: torch.Tensor
    _unsaved: torch.Tensor
    _epoch: int
    _unsaved_log: list[np.ndarray]
    _removed: list[torch.Tensor]
    _tombstones: list[torch.Tensor] | None
    _publishing: bool  # a delta log follows the store: spilled rows keep their mark for it
    # Checkpoints are taken (saved_rows was called): until then nothing keeps the ids an
    # increment would need (the first checkpoint of a run is full), so a run without
    # checkpoints piles none up.
    _saving: bool

    # The store's own (EmbeddingStore's and Spilling's), as attributes: a stub method here
    # would come before Spilling's in the store's method order.
    _ids_t: Callable[[Ids], torch.Tensor]
    _sunk: Callable[[torch.Tensor], torch.Tensor]
    _with_dirty_rows: Callable[[np.ndarray, torch.Tensor], tuple[np.ndarray, torch.Tensor]]
    _with_unsaved_disk_rows: Callable[[Rows], Rows]
    _unpublish_spilled: Callable[[torch.Tensor | None, torch.Tensor | None], None]
    export: Callable[[], Rows]
    _rows_at: Callable[[torch.Tensor, torch.Tensor], Rows]
    _tier: DiskTier | None
    device: torch.device

    # -- the delta log -----------------------------------------------------------------------

    def changes(self) -> tuple[np.ndarray, torch.Tensor]:
        """Rows changed since the last call, ids sorted, with their values (now published)."""
        ids, slots = self._index.items()
        changed = self._changed[slots]
        ids, slots = ids[changed], slots[changed]
        order = torch.argsort(ids)
        ids, slots = ids[order], slots[order]
        self._changed[slots] = False
        return self._with_dirty_rows(ids.cpu().numpy(), self._values.index_select(0, slots))

    def unpublish(self, ids: Ids | None = None) -> None:
        """Count rows ``ids`` (every row: None) as changed, to publish them again."""
        self._publishing = True
        if ids is None:
            self._changed[:] = True
            self._unpublish_spilled(None, None)
        else:
            flat = self._ids_t(ids)
            slots = self._index.find(flat)
            self._changed[self._sunk(slots)] = True
            self._unpublish_spilled(flat, slots)
        self._changed[-1] = False  # the sink row (the last)

    def track_evictions(self, on: bool = True) -> None:
        """Keep a tombstone for every evicted row that was ever updated (off: keep none); on,
        a delta log follows the store."""
        self._tombstones = [] if on else None
        self._publishing = self._publishing or on

    def take_tombstones(self) -> np.ndarray:
        """Ids evicted since the last call that were ever updated (sorted)."""
        if not self._tombstones:
            return np.zeros(0, np.int64)
        ids = torch.unique(torch.cat(self._tombstones))
        self._tombstones = []
        return ids.cpu().numpy()

    # -- checkpoints -------------------------------------------------------------------------

    def saved_rows(self, full: bool, part_rows: int = 1 << 21
                   ) -> tuple[Iterator[Rows], np.ndarray]:
        """The rows a checkpoint writes, after which every row counts as saved.

        Args:
            full: Every row, in either tier (a base); else only the rows changed, created or
                moved in since the last call (an increment).
            part_rows: Rows a part of the disk tier's (a full checkpoint reads a table larger
                than memory a part at a time).

        Returns:
            (the rows in parts of (ids sorted, values, optimizer state, versions): a full
            checkpoint's memory rows, then the disk tier's ``part_rows`` at a time, read as
            the parts are taken, before the store changes again; an increment's in one part),
            and the ids removed since the last call, sorted: rows dropped by eviction, which a
            restore of the increment's predecessors must forget; an id removed and then created
            again is in both, and its row wins. A full checkpoint removes nothing.
        """
        removed = np.zeros(0, np.int64)
        if full:
            parts = self._every_row(part_rows)
        else:
            if self._removed:
                removed = torch.unique(torch.cat(self._removed)).cpu().numpy()
            ids, slots = self._index.items()
            unsaved = self._unsaved[slots]
            ids, slots = ids[unsaved], slots[unsaved]
            order = torch.argsort(ids)
            parts = iter([self._with_unsaved_disk_rows(self._rows_at(ids[order], slots[order]))])
        self._unsaved[:] = False
        # Rows on disk marked with the epoch that ends here count as saved from now on.
        self._epoch += 1
        self._unsaved_log, self._removed, self._saving = [], [], True
        return parts, removed

    def _every_row(self, part_rows: int) -> Iterator[Rows]:
        ids, slots = self._index.items()
        order = torch.argsort(ids)
        yield self._rows_at(ids[order], slots[order])
        if self._tier is not None:
            for ids_d, values, state, versions in self._tier.chunks(part_rows):
                yield ids_d, values.to(self.device), state.to(self.device), versions
