"""The row exchange of a step with its ids on the device, for placements without replicas.

:class:`~trainer.embedding.exchange.RowExchange` decides in numpy: the batch's ids go to the
host, are routed to owners there, and every message is packed there. Here the same protocol
(the same messages, bytes and kinds; rows and updates bit for bit the same) runs on tensors
beside the rows, and the host reads the device twice a step:

1. **The split sizes.** The owner of each distinct id comes from the placement's table on the
   device (:class:`DevicePlacement`: its explicit owners by binary search, else
   ``fmix64(id) mod world``); the ids are grouped by owner with one stable sort, and the
   per-owner counts cross in the header all-to-all, on the device. One copy then brings the
   distinct count, the counts sent and received, and the caller's extra values (the last
   step's loss) to the host: every later message's size is known from it.
2. **The owner's lookup.** The owner looks up, once, its own ids and the ids other ranks
   asked for (:meth:`DeviceStore.lookup_padded`; its one wait is the count of ids without a
   row, which sizes row creation). The rows reply and the gradients are sized by the counts
   of the first wait.

Then the owner sums each row's gradients (its own first, then each requester's in rank order,
as ``RowExchange`` does) and applies the row optimizer once. With replicas, copies need lag
counts, notices and refreshes (``RowExchange``); the trainer takes that path while any rank
holds replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from partitioner import Placement
from trainer.counters import StepCounters
from trainer.embedding.dedup import unique_padded
from trainer.embedding.device_init import fmix64_mod
from trainer.embedding.device_store import DeviceStore, PaddedLookup
from trainer.embedding.exchange import RowExchange

__all__ = ["DeviceExchange", "DevicePlacement", "DevicePlan"]


class DevicePlacement:
    """A placement's owners as tensors on one device: ``Placement.owner_of`` without the host."""

    def __init__(self, placement: Placement, device: torch.device) -> None:
        """Copy the explicit table to ``device`` (once per placement: the copy waits).

        Args:
            placement: Owners and replicas of rows.
            device: Where the ids to place are.
        """
        self.placement = placement
        self.world = placement.num_workers
        self._ids = torch.tensor(placement.ids, dtype=torch.int64, device=device)
        self._owners = torch.tensor(placement.owners, dtype=torch.int64, device=device)

    def owner_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Owner of each id (int64, shape of ``ids``): explicit owner, else the default."""
        owner = fmix64_mod(ids, self.world)
        if self._ids.numel():
            pos = torch.searchsorted(self._ids, ids).clamp_(max=self._ids.numel() - 1)
            owner = torch.where(self._ids[pos] == ids, self._owners[pos], owner)
        return owner


@dataclass
class DevicePlan:
    """What :meth:`DeviceExchange.read` leaves for :meth:`DeviceExchange.write`.

    Attributes:
        values: ``[n, row_dim]`` the row of each distinct id of the batch, as read.
        own: Positions (among the distinct ids) of the ids owned here.
        fetch: Positions of the others, grouped by owner (ascending within each).
        sent: Ids fetched from each rank (0 for this one).
        received: Ids each rank fetched from here.
        served: The owner's lookup of its own ids and the ids asked of it (None: none).
        inverse: Position in ``served.ids`` of each own id, then of each id asked for (by
            requester), the order in which their gradients are summed.
        extra: The caller's extra values, read back with the split sizes.
    """

    values: torch.Tensor
    own: torch.Tensor
    fetch: torch.Tensor
    sent: list[int]
    received: list[int]
    served: PaddedLookup | None
    inverse: torch.Tensor
    extra: list[float]


class DeviceExchange:
    """Reads and writes rows of one rank's device-resident batches against their owners."""

    def __init__(self, rows: RowExchange) -> None:
        """Run ``rows``'s protocol (comm, device store, placement) on the device.

        Args:
            rows: The rank's host exchange: it keeps following the placement (and serves
                flushes and evaluation reads), so the two never part.
        """
        if not isinstance(rows.store, DeviceStore):
            raise TypeError("the device exchange needs the device store (--store-index device)")
        self.rows = rows
        self.store: DeviceStore = rows.store
        self._placed: DevicePlacement | None = None

    @staticmethod
    def takes(placement: Placement) -> bool:
        """Whether a step under ``placement`` can take this exchange (no rank holds replicas;
        every rank sees the same placement, so all decide alike)."""
        return not any(r.size for r in placement.replicas)

    def _placement(self) -> DevicePlacement:
        p = self.rows.placement
        if self._placed is None or self._placed.placement is not p:
            self._placed = DevicePlacement(p, self.store.device)
        return self._placed

    def read(self, ids: torch.Tensor, count: torch.Tensor, step: int, counters: StepCounters,
             extra: torch.Tensor | None = None) -> DevicePlan:
        """Rows of the distinct ids ``ids[:count]`` (sorted, the rest padding) for ``step``;
        this rank serves what the others ask of it.

        Args:
            ids: int64 ``[N]`` on the device (:func:`~trainer.embedding.dedup.unique_padded`).
            count: 0-d int64 tensor: the number of distinct ids.
            step: The step.
            counters: The step's counters (reads, rows fetched and served).
            extra: Values to read back with the split sizes (any shape, read as float64).
        """
        rows, store = self.rows, self.store
        comm, me, world = rows.comm, rows.comm.rank, rows.comm.world
        rows.sync()
        if not self.takes(rows.placement):
            raise RuntimeError("the device exchange runs only while no rank holds replicas")
        device, dim = store.device, store.dim
        if store.cpu_shortcuts:  # a CPU waits for nothing: the distinct ids only, owned in numpy
            ids = ids[:int(count)]
            owner = torch.from_numpy(rows.placement.owner_of(ids.numpy()).astype(np.int64))
        else:
            # Padding goes to a bucket past the last rank.
            valid = torch.arange(ids.numel(), device=device) < count
            owner = torch.where(valid, self._placement().owner_of(ids), world)
        # One stable sort groups the ids by owner, ascending within each (they are sorted).
        order = torch.sort(owner, stable=True).indices
        per_owner = torch.zeros(world + 1, dtype=torch.int64, device=device)
        per_owner.index_add_(0, owner, torch.ones_like(owner))
        header = torch.zeros((world, 4), dtype=torch.int64, device=device)
        header[:, 0] = per_owner[:world]
        header[me, 0] = 0  # layout of RowExchange's counts: fetch, push, keep, notices
        heard = comm.all_to_all(header, [1] * world, [1] * world, "header")
        parts = [count.reshape(1), per_owner[:world], heard[:, 0]]
        if extra is not None:
            parts.append(extra.reshape(-1))
        got = torch.cat([t.to(torch.float64) for t in parts]).tolist()  # the first wait
        n = int(got[0])
        by_owner = [int(x) for x in got[1:1 + world]]
        received = [int(x) for x in got[1 + world:1 + 2 * world]]
        sent = [0 if o == me else k for o, k in enumerate(by_owner)]
        bounds = np.concatenate([[0], np.cumsum(by_owner)]).tolist()
        own = order[bounds[me]:bounds[me + 1]]
        fetch = torch.cat([order[:0], *(order[bounds[o]:bounds[o + 1]]
                                         for o in range(world) if o != me)])
        asking = comm.start_all_to_all(ids[fetch], sent, received, "request")
        own_ids = ids[own]
        wanted = torch.cat([own_ids, asking.wait()])
        if wanted.numel():
            u = unique_padded(wanted)
            served: PaddedLookup | None = store.lookup_padded(u.ids, u.n, step)  # second wait
            assert served is not None
            answer = served.values.index_select(0, u.inverse)
            inverse = u.inverse
        else:
            served, inverse = None, wanted
            answer = torch.zeros((0, dim), dtype=store.dtype, device=device)
        n_own = int(own.numel())
        back = comm.start_all_to_all(answer[n_own:].reshape(-1), [k * dim for k in received],
                                     [k * dim for k in sent], "response")
        values = torch.empty((n, dim), dtype=store.dtype, device=device)
        values.index_copy_(0, own, answer[:n_own])
        values.index_copy_(0, fetch, back.wait().view(-1, dim))
        counters.staleness = np.zeros(1, np.int64)
        counters.unique_ids += n
        counters.owned_reads += n_own
        counters.remote_rows += sum(sent)
        counters.rows_served += sum(received)
        return DevicePlan(values, own, fetch, sent, received, served, inverse, got[1 + 2 * world:])

    def write(self, plan: DevicePlan, grads: torch.Tensor, counters: StepCounters) -> None:
        """Send the gradients of fetched rows to their owners and apply, as owner, one
        optimizer step per row with the sum of its gradients (version += their number)."""
        comm, dim = self.rows.comm, self.store.dim
        arriving = comm.start_all_to_all(grads.index_select(0, plan.fetch).reshape(-1),
                                         [k * dim for k in plan.sent],
                                         [k * dim for k in plan.received], "gradient")
        own = grads.index_select(0, plan.own)
        incoming = arriving.wait().view(-1, dim)
        if plan.served is None:
            return
        m = plan.served.ids.numel()
        summed = torch.zeros((m, dim), dtype=grads.dtype, device=grads.device)
        summed.index_add_(0, plan.inverse, torch.cat([own, incoming]))
        counts = torch.zeros(m, dtype=torch.int64, device=grads.device)
        counts.index_add_(0, plan.inverse, torch.ones_like(plan.inverse))
        self.store.apply(plan.served.ids, summed, counts)
