"""The row exchange of a step: owners serve rows, replicas follow bounded staleness, gradients
return. Everything a step decides runs on tensors on the rank's device; the host reads the
device twice a step at two or more ranks, once at one.

Read phase (:meth:`RowExchange.read`), for the distinct ids of a rank's batch, each once:

* owned rows are read from the local store;
* replicated rows are read from the local copy while it is within ``s`` updates of the owner's
  row; a copy that is missing or further behind is replaced by the owner's row and optimizer
  state (HET's read rule);
* all other rows are fetched from their owner (id out, row back).

Who knows a copy's lag: its owner (:mod:`hetgmp.trainer.embedding.copies`), which tells the holder
when it passes ``s`` (a *notice*, carried by the next step's request message). So at a read
both ends know, without asking, which copies come with rows: HET's version check without a
round trip of versions.

Write phase (:meth:`RowExchange.write`): the owner sums, per row, its own gradient and the
gradients of ranks that fetched the row, and applies the row optimizer once with the sum; the
version advances by the number of gradients summed. A replica applies its gradient to its copy
at once and, when more than ``s`` updates are pending (HET's write rule), pushes their summed
gradient and optimizer-state increments, which the owner folds into that step (version +=
pushed count). With ``s = 0`` a push is a single update, sent as the gradient itself and summed
with the others. Whether a replica pushes in this step is known at read time (it pushes iff
``pending + 1 > s``), so the read request announces it and the owner knows the size of every
gradient message without another count exchange.

The host's two reads of a step, at two or more ranks:

1. **The split sizes.** The owner of each distinct id comes from the placement's table on the
   device (:class:`DevicePlacement`: its explicit owners by binary search, else
   ``fmix64(id) mod world``) and its copy, if any, from the replica table's sorted ids; one
   stable sort groups the ids by owner and kind (fetch, push, keep). The owner side decides
   its notices. The counts cross in the header all-to-all, and one copy brings them, the
   distinct count and the caller's extra values (the last step's loss) to the host: every
   request's size is known from it, and so is every gradient message's.
2. **The owner's lookup.** Once the requests (with their notices) are in, both ends know which
   copies refresh now. The owner looks up, once, its own ids, the fetched ids and the
   refreshed copies' (:meth:`EmbeddingStore.lookup_padded`). Its one wait also brings the refresh
   counts of both ends (the rows reply's sizes) and the lags of the copies read (the staleness
   histogram).

At one rank there is nothing to exchange: a read is one :meth:`EmbeddingStore.lookup_padded`
(one wait, the step's), a write one :meth:`EmbeddingStore.apply`. Between steps (flush,
evaluation, placement changes) the host may wait. Message layouts: ``docs/protocols.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hetgmp.partitioner import Placement
from hetgmp.trainer.dist import Comm, StepCounters
from hetgmp.trainer.embedding.copies import OwnerCopies
from hetgmp.trainer.embedding.dedup import unique_padded
from hetgmp.trainer.embedding.owners import DevicePlacement, find_in
from hetgmp.trainer.embedding.path import EmbeddingPath
from hetgmp.trainer.embedding.replicas import ReplicaTable
from hetgmp.trainer.embedding.store import EmbeddingStore
from hetgmp.trainer.embedding.types import Audit, PaddedLookup, Read

__all__ = ["ReadPlan", "RowExchange"]

# Kinds of a request entry: fetch a row (no copy here), push a copy's updates, keep a copy.
FETCH, PUSH, KEEP = 0, 1, 2


@dataclass
class ReadPlan(Read):
    """What :meth:`RowExchange.read` leaves for :meth:`RowExchange.write` (besides
    :class:`~hetgmp.trainer.embedding.types.Read`'s values, extra values and step).

    Attributes:
        local: One rank: the store's lookup (the write applies to its ids); None otherwise.
        own: Positions (among the distinct ids) of the ids owned here, ``own_ids`` those ids.
        fetch: Positions of the rows fetched, by owner (ascending within each).
        replica: Positions of the copies read, by owner, pushes before keeps;
            ``replica_slots`` their slots; ``pushing`` which of them push (positions in it).
        parts: Per rank, ids fetched from it, copies pushed to it, copies kept, notices sent.
        heard: The same, from each rank.
        asked: Per rank, the ids it fetched from here, pushed here and their update counts.
        reuse: Without copies, the owner's lookup and the position in it of each own id, then
            of each id fetched from here: the write sums the gradients over it.
    """

    local: PaddedLookup | None = None
    own: torch.Tensor | None = None
    own_ids: torch.Tensor | None = None
    fetch: torch.Tensor | None = None
    replica: torch.Tensor | None = None
    replica_slots: torch.Tensor | None = None
    pushing: torch.Tensor | None = None
    parts: list[list[int]] | None = None
    heard: list[list[int]] | None = None
    asked: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
    reuse: tuple[PaddedLookup, torch.Tensor] | None = None


class RowExchange(EmbeddingPath):
    """Reads and writes rows of one rank's batches against the owners of a placement.

    The rank's store, its replica table and the owner side's record of the copies other ranks
    hold of its rows all live on the rank's device; :attr:`placement` and :attr:`replicas` are
    replaced between steps (:class:`hetgmp.trainer.step.Trainer` does), and the next read or flush
    follows the change (:meth:`sync`).
    """

    def __init__(self, comm: Comm, store: EmbeddingStore, replicas: ReplicaTable,
                 placement: Placement, staleness: int) -> None:
        """Bind a rank's store and replicas to the job's placement.

        Args:
            comm: Collectives of the job.
            store: This rank's primaries.
            replicas: This rank's copies (``placement.replicas[rank]``).
            placement: Owners and replicas of every row.
            staleness: The bound ``s``.
        """
        if placement.num_workers != comm.world:
            raise ValueError(f"placement for {placement.num_workers} ranks, job has {comm.world}")
        self.comm = comm
        self.store = store
        self.replicas = replicas
        self.placement = placement
        self.s = staleness
        self.dim, self.gw = store.dim, store.dim + store.optimizer.count_width  # gw: gradients'
        self.state_width = store.optimizer.state_width
        self.device = store.device
        self.audit: Audit | None = None
        reps = [r for r in placement.replicas if r.size]
        self._replicated = np.unique(np.concatenate(reps)) if reps else np.zeros(0, np.int64)
        # Owner side: per rank, its copies of rows owned here. Both ends follow the placement
        # and replica table in force at the last sync.
        self._copies = OwnerCopies(comm.rank, self.device)
        self._synced: tuple[Placement, ReplicaTable] | None = None
        self._placed: DevicePlacement | None = None

    def set_replicated(self, ids: np.ndarray) -> None:
        """Rows some rank replicates now (what the audit log follows)."""
        self._replicated = np.asarray(ids, dtype=np.int64)

    def start_audit(self) -> Audit:
        """Log replica reads and owner updates of replicated rows from now on (tests)."""
        self.audit = Audit([], [])
        return self.audit

    # -- following placement changes ---------------------------------------------------------

    def sync(self) -> None:
        """Follow a change of placement or of this rank's replica table (between steps).

        Every rank calls it at the same points (the start of a read or a flush, both
        collective), so holder and owner decide alike: a copy keeps its lag and staleness where
        the holder had it before and its row's owner is the same; every other copy (new, or
        whose row moved) is stale, to be refreshed from its owner now at its next read.
        """
        p, table = self.placement, self.replicas
        if self._synced is not None and self._synced[0] is p and self._synced[1] is table:
            return
        me = self.comm.rank
        self._copies.follow(p)
        owners = p.owner_of(table.host_ids).astype(np.int32)
        # What the owners follow must be what this rank holds (the copies of rows it owns are
        # unused until those rows move away): otherwise message sizes would part.
        if not np.array_equal(table.host_ids[owners != me], p.replicas[me]):
            raise RuntimeError(f"rank {me}: replica table and placement disagree on its copies "
                               f"(replace_replicas and set_placement out of step)")
        if self._synced is not None:  # holder side: a copy whose row moved (new ones are stale)
            moved = self._synced[0].owner_of(table.host_ids) != owners
            table.stale |= torch.from_numpy(moved).to(self.device)
        self._synced = (p, table)
        if self._placed is None or self._placed.placement is not p:
            self._placed = DevicePlacement(p, self.device)

    # -- read --------------------------------------------------------------------------------

    def read(self, ids: torch.Tensor, count: torch.Tensor, step: int, counters: StepCounters,
             extra: torch.Tensor | None = None) -> ReadPlan:
        """Rows of the distinct ids ``ids[:count]`` (sorted, the rest padding) for ``step``;
        this rank serves what the others ask of it.

        Args:
            ids: int64 ``[N]`` on the device (:func:`~hetgmp.trainer.embedding.dedup.unique_padded`).
            count: 0-d int64 tensor: the number of distinct ids.
            step: The step.
            counters: The step's counters (reads, copies, rows fetched and served).
            extra: Values to read back with the split sizes (any shape, read as float64).
        """
        if self.comm.world == 1:
            found = self.store.lookup_padded(ids, count, step, extra=extra)  # the one wait
            n = int(found.ids.numel())
            counters.unique_ids += n
            counters.owned_reads += n
            counters.staleness = np.zeros(1, np.int64)
            return ReadPlan(found.values, found.extra, step, local=found)
        self.sync()
        assert self._placed is not None
        store, table, copies = self.store, self.replicas, self._copies
        comm, me, world, s = self.comm, self.comm.rank, self.comm.world, self.s
        device, dim, sw = self.device, self.dim, self.state_width
        if store.cpu_shortcuts:  # a CPU waits for nothing: the distinct ids only, owned in numpy
            ids = ids[:int(count)]
            owner = torch.from_numpy(self.placement.owner_of(ids.numpy()).astype(np.int64))
            valid = torch.ones(ids.numel(), dtype=torch.bool)
        else:  # padding goes to a bucket past the last rank
            valid = torch.arange(ids.numel(), device=device) < count
            owner = torch.where(valid, self._placed.owner_of(ids), world)
        pos, held = find_in(table.ids, ids)
        slot = torch.where(held & valid & (owner != me), pos, -1)
        pending = table.pending[slot.clamp(min=0)] if table.pending.numel() \
            else torch.zeros_like(slot)
        pushes = pending + 1 > s  # a copy pushes iff its pending count passes s with this step
        kind = torch.where(slot < 0, FETCH, torch.where(pushes, PUSH, KEEP))
        key = owner * 3 + kind  # owned ids: me * 3 (kind FETCH); padding: world * 3
        order = torch.sort(key, stable=True).indices
        per_key = torch.zeros(3 * world + 3, dtype=torch.int64, device=device)
        per_key.index_add_(0, key, torch.ones_like(key))
        told = copies.notices(s)  # owner side: copies more than s behind are stale from now on
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
            named = copies.ids(o)[torch.nonzero_static(told[o], size=notices[o]).reshape(-1)]
            message += [ids[order[bounds[3 * o]:bounds[3 * o + 3]]],
                        table.pending[slot[pushed]] + 1, named]
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
            table.stale[find_in(table.ids, named)[0]] = True
        refresh = table.stale[replica_slots]
        rep_owner = owner[replica]
        n_ref = torch.zeros(world, dtype=torch.int64, device=device)
        n_ref.index_add_(0, rep_owner, refresh.to(torch.int64))
        # Owner side: a copy read fresh gets a row and its lag resets; the lag of each read.
        fresh, lags = zip(*(copies.read(src, in_rep[src]) for src in range(world)))
        n_fresh = torch.stack([f.sum() for f in fresh])
        n_own = int(own.numel())
        fetched_here = [a[0] for a in asked]
        wanted = torch.cat([ids[own], *fetched_here, *in_rep])
        keep = torch.cat([torch.ones(wanted.numel() - sum(int(r.numel()) for r in in_rep),
                                     dtype=torch.bool, device=device), *fresh])
        reply_extra = torch.cat([n_ref, n_fresh, *lags]).to(torch.float64)
        reuse: tuple[PaddedLookup, torch.Tensor] | None = None
        served: PaddedLookup | None = None
        if wanted.numel() and not any(r.size for r in self.placement.replicas):
            # No copies anywhere: every id asked for gets its row, no state travels, and the
            # write sums the gradients over these very ids.
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
        if served is not None:
            values.index_copy_(0, own, served.values.index_select(0, where[:n_own]))
        n_refresh = sum(refreshes)
        kept_idx = torch.nonzero_static(~refresh, size=int(replica.numel()) - n_refresh
                                        ).reshape(-1)
        values.index_copy_(0, replica[kept_idx], table.read(replica_slots[kept_idx]))
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
            table.refresh(slots, rows_in[:, :dim], rows_in[:, dim:])
            values.index_copy_(0, replica[ref_idx], table.read(slots))
        counters.staleness = np.bincount(read_lags, minlength=1).astype(np.int64)
        counters.unique_ids += n
        counters.owned_reads += n_own
        counters.replica_reads += int(replica.numel())
        counters.replica_refreshes += n_refresh
        counters.remote_rows += int(fetch.numel())
        if self.audit is not None:  # tests: the host copies cost waits
            self.audit.reads.append(np.stack([
                np.full(int(replica.numel()), step), ids[replica].cpu().numpy(),
                refresh.cpu().numpy().astype(np.int64)], 1))
        return ReadPlan(values, got[1 + 8 * world:], step, own=own, own_ids=ids[own],
                        fetch=fetch, replica=replica, replica_slots=replica_slots,
                        pushing=pushing_t, parts=parts, heard=heard, asked=asked, reuse=reuse)

    # -- write -------------------------------------------------------------------------------

    def write(self, plan: Read, grads: torch.Tensor, counters: StepCounters) -> None:
        """Send gradients and pushes to owners, update the copies, and apply, as owner, one
        optimizer step per row.

        The gradients leave first; the copies are updated while they travel (the pushes among
        them are computed as they will stand after the update).
        """
        assert isinstance(plan, ReadPlan)
        if plan.local is not None:  # one rank: every row is owned here, each updated once
            ids = plan.local.ids
            self.store.apply(ids, grads, torch.ones(ids.numel(), dtype=torch.int64,
                                                    device=self.device))
            return
        assert plan.replica is not None and plan.replica_slots is not None
        assert plan.pushing is not None and plan.fetch is not None and plan.own is not None
        assert plan.parts is not None and plan.heard is not None and plan.asked is not None
        assert plan.own_ids is not None
        comm, me, world, s = self.comm, self.comm.rank, self.comm.world, self.s
        table, dim = self.replicas, self.gw  # a gradient's width (with CowClip's count)
        rep_grads = grads.index_select(0, plan.replica)
        increments = table.optimizer.increments(rep_grads)
        push_slots = plan.replica_slots[plan.pushing]
        push_grads = rep_grads.index_select(0, plan.pushing)
        # s = 0: a push is this step's gradient, summed by the owner with everyone else's.
        pushes = push_grads if s == 0 else table.push_with(
            push_slots, push_grads, increments.index_select(0, plan.pushing))[0]
        push_w = dim if s == 0 else dim + self.state_width
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
        table.update(plan.replica_slots, rep_grads, increments)
        if push_slots.numel():
            table.clear_pending(push_slots)
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
        self._log(plan.step, ids, sources, ones, after_reads=True)
        if p_ids:
            self._log(plan.step, torch.cat(p_ids), torch.cat(p_src), torch.cat(p_counts),
                      after_reads=True)
        if plan.reuse is not None:  # no copies: own and fetched ids, as looked up
            served, inverse = plan.reuse
            size = served.ids.numel()
            summed = torch.zeros((size, dim), dtype=grads.dtype, device=device)
            summed.index_add_(0, inverse, torch.cat(g_rows))
            counts_t = torch.zeros(size, dtype=torch.int64, device=device)
            counts_t.index_add_(0, inverse, ones)
            self.store.apply(served.ids, summed, counts_t)
            return
        pushed_in = None
        if p_ids:
            pushed_in = (torch.cat(p_ids), torch.cat(p_rows), torch.cat(p_counts),
                         torch.cat(p_src))
        self._apply(ids, torch.cat(g_rows), sources, pushed_in)

    def _apply(self, ids: torch.Tensor, grads: torch.Tensor, src: torch.Tensor,
               pushed: tuple[torch.Tensor, ...] | None) -> None:
        """One optimizer step per row with the sum of its gradients and its copies' pushes;
        then the copies of those rows fall behind.

        Args:
            ids: Ids of single-update gradients (may repeat: one per contributor).
            grads: ``[len(ids), gw]`` those gradients (with CowClip, their counts last).
            src: The rank each gradient came from.
            pushed: Replica pushes ``(ids, [k, gw + state_width] summed gradient | summed
                state increments, update counts, source ranks)``.
        """
        store, dim = self.store, self.gw
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
            self._copies.age(u, torch.where(applied, counts, 0), src, torch.ones_like(ids))
            return
        width = dim + self.state_width
        extra = torch.zeros((size, width), dtype=grads.dtype, device=grads.device)
        extra.index_add_(0, u.inverse[n_g:], pushed[1])
        has_direct = counts > 0  # before the pushes' counts join them
        counts.index_add_(0, u.inverse[n_g:], pushed[2])
        # Rows without a direct gradient this step add nothing but the pushed increments.
        inc = store.optimizer.increments(direct) * has_direct.unsqueeze(1)
        applied = store.apply(u.ids, direct + extra[:, :dim], counts,
                              increments=inc + extra[:, dim:], count=u.n)
        assert isinstance(applied, torch.Tensor)
        self._copies.age(u, torch.where(applied, counts, 0), torch.cat([src, pushed[3]]),
                  torch.cat([torch.ones_like(ids), pushed[2]]))

    def _log(self, step: int, ids: torch.Tensor, src: torch.Tensor, counts: torch.Tensor, *,
             after_reads: bool) -> None:
        """Log updates applied to replicated rows in the audit, when one is on."""
        if self.audit is None:
            return
        ids_h, src_h, counts_h = (t.cpu().numpy() for t in (ids, src, counts))
        keep = np.isin(ids_h, self._replicated)
        n = int(keep.sum())
        self.audit.applied.append(np.stack(
            [np.full(n, step), ids_h[keep], src_h[keep], counts_h[keep],
             np.full(n, int(after_reads))], 1))

    # -- between steps -----------------------------------------------------------------------

    def flush(self, step: int = -1) -> int:
        """Push pending replica changes to their owners (before evaluation, a checkpoint, or a
        change of replica sets). Collective: every rank calls it.

        Args:
            step: The step the changes are applied at (for the audit log).

        Returns:
            The number of replica rows pushed by this rank.
        """
        comm, world, device = self.comm, self.comm.world, self.device
        self.sync()
        table = self.replicas
        slots = table.pending_slots()
        ids = table.ids[slots].cpu().numpy()
        owner = self.placement.owner_of(ids)
        perm = np.argsort(owner, kind="stable")
        slots, ids, owner = slots[self._t(perm)], ids[perm], owner[perm]
        summed, counts_t = table.take_push(slots)
        counts = counts_t.cpu().numpy()
        width = self.gw + self.state_width
        sent = np.bincount(owner, minlength=world).astype(np.int64)[:, None]
        received = comm.exchange_counts(sent, "flush")[:, 0]
        bounds = np.concatenate([[0], np.cumsum(sent[:, 0])])
        msg = np.concatenate([np.concatenate([ids[bounds[o]:bounds[o + 1]],
                                              counts[bounds[o]:bounds[o + 1]]])
                              for o in range(world)])
        req = comm.all_to_all(self._t(msg), 2 * sent[:, 0], 2 * received, "flush")
        rows_in = comm.all_to_all(summed.reshape(-1), sent[:, 0] * width, received * width,
                                  "flush").view(-1, width)
        in_ids, in_counts, in_src, pos = [], [], [], 0
        for src, n in enumerate(received.tolist()):
            in_ids.append(req[pos:pos + n])
            in_counts.append(req[pos + n:pos + 2 * n])
            in_src.append(torch.full((n,), src, dtype=torch.int64, device=device))
            pos += 2 * n
        pushed = (torch.cat(in_ids), rows_in, torch.cat(in_counts), torch.cat(in_src))
        self._log(step, pushed[0], pushed[3], pushed[2], after_reads=False)
        none = torch.zeros(0, dtype=torch.int64, device=device)
        self._apply(none, rows_in[:, :0].reshape(0, self.gw), none, pushed)
        return int(slots.numel())

    def read_only(self, uniq: np.ndarray, *, replicas: bool = False) -> torch.Tensor:
        """Rows of ``uniq`` (sorted) for evaluation, creating and touching nothing.

        Args:
            uniq: Sorted distinct ids.
            replicas: Read replicated rows from this rank's copies (the rank's own view, as it
                trains) instead of from their owners (after :meth:`flush`, the owners hold
                every update).
        """
        comm, me, world = self.comm, self.comm.rank, self.comm.world
        owner = self.placement.owner_of(uniq)
        local = owner == me
        table = self.replicas
        slots = table.slots(uniq) if replicas else np.full(uniq.size, -1)
        assert isinstance(slots, np.ndarray)
        # A copy stands for its row only where this rank does not own the row (a migration
        # leaves copies of rows still owned here) and has been filled at least once.
        copy = np.flatnonzero(slots >= 0)
        filled = table.filled.cpu().numpy()
        unusable = local[copy] | ~filled[slots[copy]]
        slots[copy[unusable]] = -1
        local |= slots >= 0
        perm = np.argsort(owner, kind="stable")
        perm = perm[~local[perm]]
        sent = np.bincount(owner[perm], minlength=world).astype(np.int64)
        received = comm.exchange_counts(sent[:, None], "eval")[:, 0]
        req = comm.all_to_all(self._t(uniq[perm]), sent, received, "eval")
        rows = self.store.peek(req).reshape(-1)
        rows_in = comm.all_to_all(rows, received * self.dim, sent * self.dim, "eval")
        values = self.store.peek(uniq)  # owned rows (and placeholders for the rest)
        if perm.size:
            values[self._t(perm)] = rows_in.view(-1, self.dim)
        copies = np.flatnonzero(slots >= 0)
        if copies.size:
            values[self._t(copies)] = table.read(slots[copies])
        return values

    def _t(self, index: np.ndarray) -> torch.Tensor:
        return torch.tensor(index, dtype=torch.int64, device=self.device)  # a copy: may be read-only
