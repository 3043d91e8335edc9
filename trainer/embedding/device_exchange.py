"""The row exchange of a step with its ids on the device: ``RowExchange``'s protocol on tensors.

:class:`~trainer.embedding.exchange.RowExchange` decides in numpy: the batch's ids go to the
host, are routed to owners there, and every message is packed there. Here the same protocol
(the same messages, bytes and kinds; rows, copies, versions and lag counts bit for bit the
same) runs on tensors beside the rows, and the host reads the device twice a step:

1. **The split sizes.** The owner of each distinct id comes from the placement's table on the
   device (:class:`DevicePlacement`: its explicit owners by binary search, else
   ``fmix64(id) mod world``) and its copy, if any, from the replica table's sorted ids; one
   stable sort groups the ids by owner and kind (fetch, push, keep). The owner side decides
   its notices (copies more than ``s`` behind). The counts cross in the header all-to-all on
   the device, and one copy brings them, the distinct count and the caller's extra values
   (the last step's loss) to the host: every request's size is known from it, and so is every
   gradient message's.
2. **The owner's lookup.** Once the requests (with their notices) are in, both ends know which
   copies refresh now: the holder from its stale flags, the owner from its own record of
   them. The owner looks up, once, its own ids, the fetched ids and the refreshed copies'
   (:meth:`DeviceStore.lookup_padded`, compacted from the padded requests by a stable sort).
   Its one wait, the count of ids without a row, also brings the refresh counts of both ends
   (the rows reply's sizes) and the lags of the copies read (the staleness histogram).

The copies' flags and counts (the replica table's ``stale``, ``filled`` and ``pending``; the
owners' lags and stale marks of the copies others hold) live on the device while steps run
(:class:`_Mirror`) and go back to their numpy homes at :meth:`DeviceExchange.release`, which
the trainer calls before anything between steps reads them (flush, evaluation, state,
replica changes); the next step loads them again.
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
from trainer.embedding.messages import FETCH, KEEP, PUSH
from trainer.embedding.replicas import ReplicaTable

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


def _find(sorted_ids: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Position of each of ``ids`` in ``sorted_ids`` (clamped) and whether it is there."""
    if sorted_ids.numel() == 0:
        zero = torch.zeros_like(ids)
        return zero, zero.bool()
    pos = torch.searchsorted(sorted_ids, ids).clamp_(max=sorted_ids.numel() - 1)
    return pos, sorted_ids[pos] == ids


@dataclass
class _Mirror:
    """The protocol's flags and counts on the device, loaded from their numpy homes.

    Attributes:
        placement: The placement and ``table`` the replica table they were loaded for.
        rep_ids: The table's sorted ids; ``stale``, ``filled``, ``pending`` its flags and
            counts (``ReplicaTable``'s).
        copies: Per rank, the copies it holds of rows owned here: ids, lags, stale marks
            (``RowExchange.owner_copies``), and ``homes`` those numpy arrays.
    """

    placement: Placement
    table: ReplicaTable
    rep_ids: torch.Tensor
    stale: torch.Tensor
    filled: torch.Tensor
    pending: torch.Tensor
    copies: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    homes: list[tuple[np.ndarray, np.ndarray, np.ndarray]]

    @classmethod
    def load(cls, rows: RowExchange, device: torch.device) -> _Mirror:
        t = rows.replicas
        on = lambda a: torch.tensor(a, device=device)  # noqa: E731
        homes = rows.owner_copies()
        return cls(rows.placement, t, on(t.ids), on(t.stale), on(t.filled), on(t.pending),
                   [(on(i), on(lag), on(st)) for i, lag, st in homes], homes)

    def store(self) -> None:
        """Write the flags and counts back where the host reads them."""
        t = self.table
        t.stale[:] = self.stale.cpu().numpy()
        t.filled[:] = self.filled.cpu().numpy()
        t.pending[:] = self.pending.cpu().numpy()
        for (_, lag, stale), (_, lag_home, stale_home) in zip(self.copies, self.homes):
            lag_home[:] = lag.cpu().numpy()
            stale_home[:] = stale.cpu().numpy()


@dataclass
class DevicePlan:
    """What :meth:`DeviceExchange.read` leaves for :meth:`DeviceExchange.write`.

    Attributes:
        values: ``[n, row_dim]`` the row of each distinct id of the batch, as read.
        own: Positions (among the distinct ids) of the ids owned here, ``own_ids`` those ids.
        fetch: Positions of the rows fetched, by owner (ascending within each).
        replica: Positions of the copies read, by owner, pushes before keeps;
            ``replica_slots`` their slots; ``pushing`` which of them push (positions in it).
        parts: Per rank, ids fetched from it, copies pushed to it, copies kept, notices sent.
        heard: The same, from each rank.
        asked: Per rank, the ids it fetched from here, pushed here and their update counts.
        reuse: Without copies, the owner's lookup and the position in it of each own id, then
            of each id fetched from here: the write sums the gradients over it.
        extra: The caller's extra values, read back with the split sizes.
        step: The step.
    """

    values: torch.Tensor
    own: torch.Tensor
    own_ids: torch.Tensor
    fetch: torch.Tensor
    replica: torch.Tensor
    replica_slots: torch.Tensor
    pushing: torch.Tensor
    parts: list[list[int]]
    heard: list[list[int]]
    asked: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    reuse: tuple[PaddedLookup, torch.Tensor] | None
    extra: list[float]
    step: int


class DeviceExchange:
    """Reads and writes rows of one rank's device-resident batches against their owners."""

    def __init__(self, rows: RowExchange) -> None:
        """Run ``rows``'s protocol (comm, device store, replicas, placement) on the device.

        Args:
            rows: The rank's host exchange: it follows the placement between steps (and serves
                flushes and evaluation reads), so the two never part.
        """
        if not isinstance(rows.store, DeviceStore):
            raise TypeError("the device exchange needs the device store (--store-index device)")
        self.rows = rows
        self.store: DeviceStore = rows.store
        self._placed: DevicePlacement | None = None
        self._mirror: _Mirror | None = None

    def release(self) -> None:
        """Put the copies' flags and counts back in the replica table and the host exchange
        (before anything between steps reads them; the next step loads them again)."""
        if self._mirror is not None:
            self._mirror.store()
            self._mirror = None

    def _acquire(self) -> _Mirror:
        rows = self.rows
        m = self._mirror
        if m is not None and (m.placement is not rows.placement or m.table is not rows.replicas):
            self.release()  # the placement or the copies changed: the host follows them first
            m = None
        if m is None:
            rows.sync()
            m = self._mirror = _Mirror.load(rows, self.store.device)
        if self._placed is None or self._placed.placement is not rows.placement:
            self._placed = DevicePlacement(rows.placement, self.store.device)
        return m

    # -- read --------------------------------------------------------------------------------

    def read(self, ids: torch.Tensor, count: torch.Tensor, step: int, counters: StepCounters,
             extra: torch.Tensor | None = None) -> DevicePlan:
        """Rows of the distinct ids ``ids[:count]`` (sorted, the rest padding) for ``step``;
        this rank serves what the others ask of it.

        Args:
            ids: int64 ``[N]`` on the device (:func:`~trainer.embedding.dedup.unique_padded`).
            count: 0-d int64 tensor: the number of distinct ids.
            step: The step.
            counters: The step's counters (reads, copies, rows fetched and served).
            extra: Values to read back with the split sizes (any shape, read as float64).
        """
        rows, store, m = self.rows, self.store, self._acquire()
        comm, me, world, s = rows.comm, rows.comm.rank, rows.comm.world, rows.s
        device, dim, sw = store.device, store.dim, store.optimizer.state_width
        assert self._placed is not None
        if store.cpu_shortcuts:  # a CPU waits for nothing: the distinct ids only, owned in numpy
            ids = ids[:int(count)]
            owner = torch.from_numpy(rows.placement.owner_of(ids.numpy()).astype(np.int64))
            valid = torch.ones(ids.numel(), dtype=torch.bool)
        else:  # padding goes to a bucket past the last rank
            valid = torch.arange(ids.numel(), device=device) < count
            owner = torch.where(valid, self._placed.owner_of(ids), world)
        pos, held = _find(m.rep_ids, ids)
        slot = torch.where(held & valid & (owner != me), pos, -1)
        pending = m.pending[slot.clamp(min=0)] if m.pending.numel() else torch.zeros_like(slot)
        pushes = pending + 1 > s  # a copy pushes iff its pending count passes s with this step
        kind = torch.where(slot < 0, FETCH, torch.where(pushes, PUSH, KEEP))
        key = owner * 3 + kind  # owned ids: me * 3 (kind FETCH); padding: world * 3
        order = torch.sort(key, stable=True).indices
        per_key = torch.zeros(3 * world + 3, dtype=torch.int64, device=device)
        per_key.index_add_(0, key, torch.ones_like(key))
        # Owner side: copies that fell more than s behind are stale from now on (notices).
        told = []
        for _, lag, stale in m.copies:
            new = ~stale & (lag > s)
            stale |= new
            told.append(new)
        header = torch.zeros((world, 4), dtype=torch.int64, device=device)
        header[:, :3] = per_key[:3 * world].view(world, 3)
        header[me, :3] = 0
        header[:, 3] = torch.stack([t.sum() for t in told])
        heard_t = comm.all_to_all(header, [1] * world, [1] * world, "header")
        parts_t = [count.reshape(1), per_key[:3 * world], header[:, 3], heard_t.reshape(-1)]
        if extra is not None:
            parts_t.append(extra.reshape(-1))
        got = torch.cat([t.to(torch.float64) for t in parts_t]).tolist()  # the first wait
        n = int(got[0])
        by_key = [int(x) for x in got[1:1 + 3 * world]]
        notices = [int(x) for x in got[1 + 3 * world:1 + 4 * world]]
        flat = [int(x) for x in got[1 + 4 * world:1 + 8 * world]]
        heard = [flat[4 * r:4 * r + 4] for r in range(world)]
        bounds = np.concatenate([[0], np.cumsum(by_key)]).tolist()

        def bucket(o: int, k: int) -> torch.Tensor:
            return order[bounds[3 * o + k]:bounds[3 * o + k + 1]]

        others = [o for o in range(world) if o != me]
        parts = [[0, 0, 0, notices[o]] if o == me else [*by_key[3 * o:3 * o + 3], notices[o]]
                 for o in range(world)]
        own = bucket(me, FETCH)
        fetch = torch.cat([order[:0], *(bucket(o, FETCH) for o in others)])
        replica = torch.cat([order[:0], *(order[bounds[3 * o + 1]:bounds[3 * o + 3]]
                                          for o in others)])
        replica_slots = slot[replica]
        pushing, start = [], 0
        for o in others:  # each owner's copies: its pushes, then its keeps
            pushing.append(torch.arange(start, start + parts[o][1], device=device))
            start += parts[o][1] + parts[o][2]
        pushing_t = torch.cat([replica[:0], *pushing])
        # The request to each rank: ids (fetch | push | keep), push counts, notices.
        message, sizes = [], []
        for o in range(world):
            if o == me:
                message.append(ids[:0])
                sizes.append(0)
                continue
            pushed = bucket(o, PUSH)
            named = m.copies[o][0][torch.nonzero_static(told[o], size=notices[o]).reshape(-1)]
            message += [ids[order[bounds[3 * o]:bounds[3 * o + 3]]],
                        m.pending[slot[pushed]] + 1, named]
            sizes.append(sum(parts[o][:3]) + parts[o][1] + notices[o])
        recv = [f + 2 * p + k + t for f, p, k, t in heard]
        request = comm.start_all_to_all(torch.cat(message), sizes, recv, "request").wait()
        asked, in_rep, told_here, at = [], [], [], 0
        for f, p, k, t in heard:
            piece = request[at:at + f + p + k + p + t]
            asked.append((piece[:f], piece[f:f + p], piece[f + p + k:f + p + k + p]))
            in_rep.append(piece[f:f + p + k])
            told_here.append(piece[f + p + k + p:])
            at += f + 2 * p + k + t
        # Holder side: copies whose owners say they fell behind; then which reads refresh.
        named = torch.cat(told_here)
        if named.numel():
            m.stale[_find(m.rep_ids, named)[0]] = True
        refresh = m.stale[replica_slots]
        rep_owner = owner[replica]
        n_ref = torch.zeros(world, dtype=torch.int64, device=device)
        n_ref.index_add_(0, rep_owner, refresh.to(torch.int64))
        # Owner side: a copy read fresh gets a row and its lag resets; the lag of each read.
        fresh, lags = [], []
        for src in range(world):
            cid, lag, stale = m.copies[src]
            if in_rep[src].numel() == 0:
                fresh.append(torch.zeros(0, dtype=torch.bool, device=device))
                lags.append(torch.zeros(0, dtype=torch.int64, device=device))
                continue
            at_c = _find(cid, in_rep[src])[0]
            f_src = stale[at_c]
            lag_src = torch.where(f_src, 0, lag[at_c])
            lag[at_c] = lag_src
            stale[at_c] = False
            fresh.append(f_src)
            lags.append(lag_src)
        n_fresh = torch.stack([f.sum() for f in fresh])
        n_own = int(own.numel())
        fetched_here = [a[0] for a in asked]
        wanted = torch.cat([ids[own], *fetched_here, *in_rep])
        keep = torch.cat([torch.ones(wanted.numel() - sum(int(r.numel()) for r in in_rep),
                                     dtype=torch.bool, device=device), *fresh])
        reply_extra = torch.cat([n_ref, n_fresh, *lags]).to(torch.float64)
        reuse: tuple[PaddedLookup, torch.Tensor] | None = None
        served: PaddedLookup | None = None
        if wanted.numel() and not any(r.size for r in rows.placement.replicas):
            # No copies anywhere: every id asked for gets its row, no state travels, and the
            # write sums the gradients over these very ids (as the host's _apply would).
            u = unique_padded(wanted)
            served = store.lookup_padded(u.ids, u.n, step, extra=reply_extra)  # 2nd wait
            where, got2, reuse = u.inverse, served.extra, (served, u.inverse)
        elif wanted.numel():
            u = unique_padded(wanted)
            kept = torch.zeros(wanted.numel(), dtype=torch.int64, device=device)
            kept.index_add_(0, u.inverse, keep.to(torch.int64))
            chosen = kept > 0  # distinct ids some valid entry names, first by a stable sort
            first = torch.sort((~chosen).to(torch.int8), stable=True).indices
            rank = torch.cumsum(chosen, 0) - 1
            served = store.lookup_padded(
                u.ids[first], chosen.sum(), step, with_state=True, extra=reply_extra)  # 2nd wait
            where = rank[u.inverse]
            got2 = served.extra
        else:
            served, where = None, wanted
            got2 = reply_extra.tolist() if reply_extra.numel() else []
        refreshes = [int(x) for x in got2[:world]]
        fresh_n = [int(x) for x in got2[world:2 * world]]
        read_lags = np.asarray(got2[2 * world:], dtype=np.int64)
        # The rows reply to each rank: fetched rows, then refreshed copies' rows and state.
        width = dim + sw
        reply, reply_sizes, at = [], [], n_own
        offsets = (n_own + sum(int(x.numel()) for x in fetched_here) + np.concatenate(
            [[0], np.cumsum([int(r.numel()) for r in in_rep])])).tolist()
        both = None
        if served is not None and served.state is not None:
            both = torch.cat([served.values, served.state], dim=1)
        for src in range(world):
            nf = int(fetched_here[src].numel())
            if served is not None:
                reply.append(served.values.index_select(0, where[at:at + nf]).reshape(-1))
            if fresh_n[src]:
                assert both is not None
                mine = where[offsets[src]:offsets[src] + int(in_rep[src].numel())]
                mine = mine[torch.nonzero_static(fresh[src], size=fresh_n[src]).reshape(-1)]
                reply.append(both.index_select(0, mine).reshape(-1))
            at += nf
            reply_sizes.append(nf * dim + fresh_n[src] * width)
            if src != me:
                counters.rows_served += nf + fresh_n[src]
        back = comm.start_all_to_all(
            torch.cat(reply) if reply else torch.zeros(0, dtype=store.dtype, device=device),
            reply_sizes, [parts[o][0] * dim + refreshes[o] * width for o in range(world)],
            "response")
        values = torch.empty((n, dim), dtype=store.dtype, device=device)
        table = m.table
        if served is not None:
            values.index_copy_(0, own, served.values.index_select(0, where[:n_own]))
        n_refresh = sum(refreshes)
        kept_idx = torch.nonzero_static(~refresh, size=int(replica.numel()) - n_refresh
                                        ).reshape(-1)
        values.index_copy_(0, replica[kept_idx],
                           table.values.index_select(0, replica_slots[kept_idx]))
        arrived, fetched, fresh_rows = back.wait(), [], []
        at = 0
        for o in range(world):
            nf, nr = parts[o][0] * dim, refreshes[o] * width
            fetched.append(arrived[at:at + nf].view(-1, dim))
            fresh_rows.append(arrived[at + nf:at + nf + nr].view(-1, width))
            at += nf + nr
        values.index_copy_(0, fetch, torch.cat(fetched))
        if n_refresh:
            ref_idx = torch.nonzero_static(refresh, size=n_refresh).reshape(-1)
            slots = replica_slots[ref_idx]
            rows_in = torch.cat(fresh_rows)
            # ReplicaTable.refresh: the owner's row, the copy's unpushed updates kept.
            pending = table.values.index_select(0, slots) - table.base.index_select(0, slots)
            table.values.index_copy_(0, slots, rows_in[:, :dim] + pending)
            table.base.index_copy_(0, slots, rows_in[:, :dim])
            table.state.index_copy_(0, slots, rows_in[:, dim:]
                                    + table.pending_state.index_select(0, slots))
            m.stale[slots] = False
            m.filled[slots] = True
            values.index_copy_(0, replica[ref_idx], table.values.index_select(0, slots))
        counters.staleness = np.bincount(read_lags, minlength=1).astype(np.int64)
        counters.unique_ids += n
        counters.owned_reads += n_own
        counters.replica_reads += int(replica.numel())
        counters.replica_refreshes += n_refresh
        counters.remote_rows += int(fetch.numel())
        if rows.audit is not None:  # tests: the host copies cost waits the audit may have
            rows.audit.reads.append(np.stack([
                np.full(int(replica.numel()), step), ids[replica].cpu().numpy(),
                refresh.cpu().numpy().astype(np.int64)], 1))
        return DevicePlan(values, own, ids[own], fetch, replica, replica_slots, pushing_t, parts,
                          heard, asked, reuse, got[1 + 8 * world:], step)

    # -- write -------------------------------------------------------------------------------

    def write(self, plan: DevicePlan, grads: torch.Tensor, counters: StepCounters) -> None:
        """Send gradients and pushes to owners, update the copies, and apply, as owner, one
        optimizer step per row (``RowExchange.write``, in the same order)."""
        rows, m = self.rows, self._acquire()
        comm, me, world, s = rows.comm, rows.comm.rank, rows.comm.world, rows.s
        table, dim = m.table, self.store.dim
        rep_grads = grads.index_select(0, plan.replica)
        increments = table.optimizer.increments(rep_grads)
        push_slots = plan.replica_slots[plan.pushing]
        push_grads = rep_grads.index_select(0, plan.pushing)
        summed = torch.cat([table.pending_grad.index_select(0, push_slots) + push_grads,
                            table.pending_state.index_select(0, push_slots)
                            + increments.index_select(0, plan.pushing)], dim=1)
        pushes = push_grads if s == 0 else summed
        push_w = dim if s == 0 else dim + table.optimizer.state_width
        counters.replica_pushes += int(push_slots.numel())
        fetch_grads = grads.index_select(0, plan.fetch)
        out, f_at, p_at = [], 0, 0
        for o in range(world):
            nf, np_ = plan.parts[o][0], plan.parts[o][1]
            out += [fetch_grads[f_at:f_at + nf].reshape(-1), pushes[p_at:p_at + np_].reshape(-1)]
            f_at, p_at = f_at + nf, p_at + np_
        arriving = comm.start_all_to_all(
            torch.cat(out), [p[0] * dim + p[1] * push_w for p in plan.parts],
            [h[0] * dim + h[1] * push_w for h in plan.heard], "gradient")
        # ReplicaTable.update and clear_pending, with the counts on the device.
        slots = plan.replica_slots
        if slots.numel():
            table.optimizer.step(table.values, table.state, slots, rep_grads, increments)
            table.pending_grad.index_add_(0, slots, rep_grads)
            table.pending_state.index_add_(0, slots, increments)
            m.pending.index_add_(0, slots, torch.ones_like(slots))
        if push_slots.numel():
            m.pending[push_slots] = 0
            for pending in (table.pending_grad, table.pending_state):
                pending.index_fill_(0, push_slots, 0)
            table.base.index_copy_(0, push_slots, table.values.index_select(0, push_slots))
        incoming = arriving.wait()
        # Owner: its own gradients, each requester's (and at s = 0 its pushes), in rank order.
        device = grads.device
        g_ids, g_rows, g_src = [plan.own_ids], [grads.index_select(0, plan.own)], [
            torch.full((int(plan.own.numel()),), me, dtype=torch.int64, device=device)]
        p_ids, p_rows, p_counts, p_src = [], [], [], []
        at = 0
        for src, (f, p, _, _) in enumerate(plan.heard):
            fetched, pushed, counts = plan.asked[src]
            g_ids.append(fetched)
            g_rows.append(incoming[at:at + f * dim].view(-1, dim))
            g_src.append(torch.full((f,), src, dtype=torch.int64, device=device))
            at += f * dim
            block = incoming[at:at + p * push_w].view(-1, push_w)
            at += p * push_w
            if s == 0:
                g_ids.append(pushed)
                g_rows.append(block)
                g_src.append(torch.full((p,), src, dtype=torch.int64, device=device))
            else:
                p_ids.append(pushed)
                p_rows.append(block)
                p_counts.append(counts)
                p_src.append(torch.full((p,), src, dtype=torch.int64, device=device))
        ids, sources = torch.cat(g_ids), torch.cat(g_src)
        ones = torch.ones_like(ids)
        if rows.audit is not None:
            rows.log_applied(plan.step, ids.cpu().numpy(), sources.cpu().numpy(),
                             ones.cpu().numpy(), after_reads=True)
            if p_ids:
                rows.log_applied(plan.step, torch.cat(p_ids).cpu().numpy(),
                                 torch.cat(p_src).cpu().numpy(),
                                 torch.cat(p_counts).cpu().numpy(), after_reads=True)
        if plan.reuse is not None:  # no copies: own and fetched ids, as looked up
            served, inverse = plan.reuse
            size = served.ids.numel()
            summed = torch.zeros((size, dim), dtype=grads.dtype, device=device)
            summed.index_add_(0, inverse, torch.cat(g_rows))
            counts = torch.zeros(size, dtype=torch.int64, device=device)
            counts.index_add_(0, inverse, ones)
            self.store.apply(served.ids, summed, counts)
            return
        pushed_in = None
        if p_ids:
            pushed_in = (torch.cat(p_ids), torch.cat(p_rows), torch.cat(p_counts),
                         torch.cat(p_src))
        self._apply(m, ids, torch.cat(g_rows), sources, pushed_in)

    def _apply(self, m: _Mirror, ids: torch.Tensor, grads: torch.Tensor, src: torch.Tensor,
               pushed: tuple[torch.Tensor, ...] | None) -> None:
        """``RowExchange._apply`` on the device: one optimizer step per row with the sum of
        its gradients and its copies' pushes; then the copies of those rows fall behind."""
        store, dim = self.store, self.store.dim
        p_ids = pushed[0] if pushed is not None else ids[:0]
        every = torch.cat([ids, p_ids])
        if every.numel() == 0:
            return
        u = unique_padded(every)
        size, n_g = every.numel(), ids.numel()
        direct = torch.zeros((size, dim), dtype=grads.dtype, device=grads.device)
        direct.index_add_(0, u.inverse[:n_g], grads)
        counts = torch.zeros(size, dtype=torch.int64, device=grads.device)
        counts.index_add_(0, u.inverse[:n_g], torch.ones_like(ids))
        if pushed is None:
            applied = store.apply(u.ids, direct, counts, count=u.n)
            assert isinstance(applied, torch.Tensor)
            self._age(m, u, torch.where(applied, counts, 0), src, torch.ones_like(ids))
            return
        width = dim + store.optimizer.state_width
        extra = torch.zeros((size, width), dtype=grads.dtype, device=grads.device)
        extra.index_add_(0, u.inverse[n_g:], pushed[1])
        has_direct = counts > 0  # before the pushes' counts join them
        counts.index_add_(0, u.inverse[n_g:], pushed[2])
        inc = store.optimizer.increments(direct) * has_direct.unsqueeze(1)
        applied = store.apply(u.ids, direct + extra[:, :dim], counts,
                              increments=inc + extra[:, dim:], count=u.n)
        assert isinstance(applied, torch.Tensor)
        self._age(m, u, torch.where(applied, counts, 0), torch.cat([src, pushed[3]]),
                  torch.cat([torch.ones_like(ids), pushed[2]]))

    @staticmethod
    def _age(m: _Mirror, u: object, counts: torch.Tensor, src: torch.Tensor,
             updates: torch.Tensor) -> None:
        """``RowExchange._age``: a copy of a row just updated falls behind by every update
        but its holder's own (``counts``: updates applied to each of ``u``'s rows)."""
        ids, inverse, n = u.ids, u.inverse, u.n  # type: ignore[attr-defined]
        # The padding past n is not sorted: search an array whose tail repeats the last id.
        last = ids.gather(0, (n - 1).clamp(min=0).reshape(1))
        ordered = torch.where(torch.arange(ids.numel(), device=ids.device) < n, ids, last)
        for holder, (cid, lag, _) in enumerate(m.copies):
            if cid.numel() == 0:
                continue
            pos, hit = _find(ordered, cid)
            own = torch.zeros(ids.numel(), dtype=torch.int64, device=ids.device)
            own.index_add_(0, inverse, updates * (src == holder))
            own = torch.where(counts > 0, own, 0)
            lag += torch.where(hit & (pos < n), counts[pos] - own[pos], 0)
