"""A device-resident map from int64 feature ids to row slots, made of torch tensor operations.

:class:`partitioner.IdIndex` keeps the id -> slot map in numpy, so on a GPU every step's lookup
costs a device-to-host copy of the ids, a host probe and a copy back, with the stream waiting
on each. :class:`DeviceIndex` keeps the map in tensors on the rows' device: the same code runs
on CPU and CUDA, and the hot paths (:meth:`DeviceIndex.find`, ``insert``, ``remove``) read no
data back to the host, except where a design says so below. Sizes are counted on the host from
batch lengths, which is why ``insert`` takes ids that are absent and ``remove`` ids that are
present (both distinct): checking either would cost a device sync per call.

Three designs sit behind the one interface (``design=``); the default was chosen by
``bench/index_bench.py`` (see :data:`DEFAULT_DESIGN`). Syncs below are data-dependent host
decisions, each a device-to-host wait on CUDA:

====================  ===========================================  ======  =========  ======
design                how                                          find    insert     remove
====================  ===========================================  ======  =========  ======
``"probe"``           groups of slots, linear probing on groups,   0       1 / block  0
                      scatter-``amax`` slot claims                         (usually 1)
``"stash"``           each id in its home group or else in a       0       1          0
                      small sorted overflow stash
``"sorted"``          sorted main run + sorted merge buffer        0       0          0
                      (LSM), searchsorted, tombstones
====================  ===========================================  ======  =========  ======

Outside the hot paths, ``items`` and the hash designs' growth and rehash read the device (a
boolean index, and the probe design's insert readbacks while re-placing): rare, as each growth
doubles the table. See :mod:`trainer.embedding.device_hash` (``"probe"``, ``"stash"``) and
:mod:`trainer.embedding.device_sorted` (``"sorted"``) for how each works.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch

from trainer.embedding.device_hash import OpenAddressing, StashTable
from trainer.embedding.device_sorted import SortedRuns

__all__ = ["DEFAULT_DESIGN", "DESIGNS", "DeviceIndex", "Design"]

Design = Literal["probe", "stash", "sorted"]
DESIGNS: tuple[Design, ...] = ("probe", "stash", "sorted")
# Chosen at the store's level, where a training step uses it: in `hetgmp bench store` (2-core
# CPU, torch 2.13, batches of 8,192 x 26 ids, 40k distinct) "sorted" and "stash" find a step's
# rows in the same time (lookup 9.5-9.8 / 10.4 ms against 10.5-10.8 / 10.4, three runs), and
# "sorted" never waits for the device in an insert, where the stash reads its overflow count
# back: on CUDA that is a wait a step. In isolation `python -m bench.index_bench` (batches of
# 65,536 ids) favours the stash's lookups (4.3 / 4.5 M ids/s in 1M / 4M entries against 3.7 /
# 1.7 for "sorted"; "probe" 1.5 / 1.6) and inserts (3.4 / 3.4 M/s against 2.0 / 1.1); the
# stash also takes ~2x the bytes of "sorted" (a hash table at load <= 1/2). Not yet measured
# on CUDA (`python -m bench.gpu --index-design` compares them there).
DEFAULT_DESIGN: Design = "sorted"


class IndexBackend(Protocol):
    """What a design implements; :class:`DeviceIndex` checks arguments and delegates."""

    size: int

    @property
    def nbytes(self) -> int:
        """Bytes held by the index's tensors."""
        ...

    def find(self, flat: torch.Tensor) -> torch.Tensor:
        """Value of each id of a flat int64 tensor, -1 where absent."""
        ...

    def insert(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        """Add distinct absent ids with their values (flat int64 tensors of one length)."""
        ...

    def remove(self, flat: torch.Tensor) -> None:
        """Remove distinct present ids (flat int64 tensor)."""
        ...

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, values) of every entry."""
        ...

    def rebuild(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the content with exactly these entries."""
        ...


class DeviceIndex:
    """int64 id -> int64 value (a row slot) for non-negative ids, held on one torch device.

    Contract, as :class:`partitioner.IdIndex` where it makes sense: ids are int64 >= 0 (up to
    ``2**63 - 1``), values int64 >= 0 (-1 is what :meth:`find` answers for an absent id). Unlike
    ``IdIndex``, nothing is checked against the table's content (that would read the device):
    ``insert`` takes distinct ids that are absent, ``remove`` distinct ids that are present.
    The table grows by itself; :meth:`rebuild` replaces the content in bulk and shrinks it.

    Attributes:
        device: Where the tensors live; ids passed in are moved there.
        design: Which design backs the index (:data:`DESIGNS`).
    """

    def __init__(
        self,
        capacity: int = 1024,
        *,
        device: torch.device | str = "cpu",
        design: Design = DEFAULT_DESIGN,
        max_load: float = 0.5,
    ) -> None:
        """Create an empty index.

        Args:
            capacity: Entries to make room for before the first growth.
            device: Where the tensors live.
            design: One of :data:`DESIGNS`.
            max_load: For the hash designs, the fraction of slots in use past which the table
                doubles; ignored by ``"sorted"``, which holds exactly its entries.
        """
        if not 0.0 < max_load < 1.0:
            raise ValueError("max_load must lie in (0, 1)")
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.device = torch.device(device)
        self.design = design
        self._impl: IndexBackend
        if design == "probe":
            self._impl = OpenAddressing(capacity, max_load, self.device)
        elif design == "stash":
            self._impl = StashTable(capacity, max_load, self.device)
        elif design == "sorted":
            self._impl = SortedRuns(self.device)
        else:
            raise ValueError(f"design must be one of {DESIGNS}, got {design!r}")

    @property
    def size(self) -> int:
        """Number of ids stored (a host count: reading it costs no sync)."""
        return self._impl.size

    @property
    def nbytes(self) -> int:
        """Bytes held by the index's tensors."""
        return self._impl.nbytes

    def _flat(self, ids: torch.Tensor) -> torch.Tensor:
        return ids.to(device=self.device, dtype=torch.int64).reshape(-1).contiguous()

    def _pair(self, ids: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat, vals = self._flat(ids), self._flat(values)
        if flat.shape != vals.shape:
            raise ValueError("ids and values must have the same number of elements")
        return flat, vals

    def find(self, ids: torch.Tensor) -> torch.Tensor:
        """Value of each id, -1 where absent.

        Args:
            ids: int64 ids of any shape (repeats allowed).

        Returns:
            int64 tensor of ``ids``' shape on :attr:`device`.
        """
        return self._impl.find(self._flat(ids)).reshape(ids.shape)

    def insert(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Add ids with their values.

        Args:
            ids: Distinct non-negative int64 ids, none of them present (any shape).
            values: Non-negative int64 values, as many as ids.
        """
        flat, vals = self._pair(ids, values)
        if flat.numel():
            self._impl.insert(flat, vals)

    def remove(self, ids: torch.Tensor) -> None:
        """Remove ids; their space is reused by later inserts.

        Args:
            ids: Distinct ids, all present (any shape). An absent id leaves the table as it was
                but is still subtracted from :attr:`size`.
        """
        flat = self._flat(ids)
        if flat.numel():
            self._impl.remove(flat)

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, values) of every entry, in no particular order (reads the device once)."""
        return self._impl.items()

    def rebuild(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the content with exactly these entries (distinct ids); sized to fit them."""
        self._impl.rebuild(*self._pair(ids, values))
