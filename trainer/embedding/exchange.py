"""Row exchange of one step: owners serve rows, replicas follow bounded staleness, gradients return.

Read phase (:meth:`RowExchange.read`), for the distinct ids of a rank's batch, each once:

* owned rows are read from the local store;
* replicated rows are read from the local copy while it is within ``s`` updates of the owner's
  row; a copy that is missing or further behind is replaced by the owner's row and optimizer
  state (HET's read rule);
* all other rows are fetched from their owner (id out, row back).

Who knows a copy's lag: its owner. The owner counts, per copy another rank holds of a row it
owns, the updates it applied that the copy has not got (every update but the holder's own
pushes); a refresh sets that count to zero. When a count passes ``s``, the owner tells the
holder (a *notice*, carried by the next step's request message) and the copy is stale until
it is read and refreshed. So at a read both ends know, without asking, which copies come with
rows: HET's version check without a round trip of versions. Both ends follow placement and
replica-set changes by the same rule (:meth:`RowExchange.sync`): a copy keeps its lag only
while both its holder's set and its row's owner stay; any other copy starts stale.

Write phase (:meth:`RowExchange.write`): the owner sums, per row, its own gradient and the
gradients of ranks that fetched the row, and applies the row optimizer once with the sum; the
version advances by the number of gradients summed. A replica applies its gradient to its copy
at once and, when more than ``s`` updates are pending (HET's write rule), pushes their summed
gradient and optimizer-state increments, which the owner folds into that step (version +=
pushed count). With ``s = 0`` a push is a single update, sent as the gradient itself and summed
with the others. Whether a replica pushes in this step is known at
read time (it pushes iff ``pending + 1 > s``), so the read request announces it and the owner
knows the size of every gradient message without another count exchange.

Collectives per step: counts, requests, rows, gradients (four all-to-alls; the counts one is
tiny). With ``s = 0`` every replica pushes every step and is refreshed whenever anyone else
updated the row, so training is synchronous.

Message layouts: :mod:`trainer.embedding.messages`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from partitioner import Placement, find_sorted
from trainer.counters import StepCounters
from trainer.dist import Comm
from trainer.embedding.device_store import DeviceStore
from trainer.embedding.messages import FETCH, PUSH, Requests, build_requests, parse_requests, split_rows
from trainer.embedding.replicas import ReplicaTable
from trainer.embedding.store import EmbeddingStore

__all__ = ["RowExchange", "ReadPlan", "Audit"]


@dataclass
class Audit:
    """Logs for checking the staleness bound independently of the owners' lag counts.

    Attributes:
        applied: int64 ``[k, 5]`` chunks ``(step, id, source rank, updates, after reads)``:
            every update an owner applied to a replicated row; ``after reads`` is 1 for the
            step's write and 0 for a flush between steps (which comes before ``step``'s reads).
        reads: int64 ``[k, 3]`` chunks ``(step, id, refreshed)``: every replica read.
    """

    applied: list[np.ndarray]
    reads: list[np.ndarray]


@dataclass
class ReadPlan:
    """What the read phase leaves for the write phase of the same step.

    Attributes:
        uniq: Sorted distinct ids of the rank's batch.
        values: ``[U, row_dim]`` row of each id, as read.
        own: Positions (in ``uniq``) of owned ids.
        replica: Positions of replicated ids, and ``replica_slots`` their copies.
        order: Positions of non-owned ids grouped by owner, then fetch / push / keep.
        kind: Kind of each entry of ``order``.
        sent: int64 ``[world, 4]`` fetch / push / keep counts sent to each owner, and the
            notices sent to each rank as owner.
        received: int64 ``[world, 4]`` the same, received from each rank.
        in_fetch: Ids other ranks fetched from this rank, by requester.
        in_push: Ids other ranks push to this rank, by requester, and ``in_push_counts``.
        push_counts: Update counts of this rank's pushes (entries of ``order`` of kind push).
        step: The step.
    """

    uniq: np.ndarray
    values: torch.Tensor
    own: np.ndarray
    replica: np.ndarray
    replica_slots: np.ndarray
    order: np.ndarray
    kind: np.ndarray
    sent: np.ndarray
    received: np.ndarray
    in_fetch: list[np.ndarray]
    in_push: list[np.ndarray]
    in_push_counts: list[np.ndarray]
    push_counts: np.ndarray
    step: int


@dataclass
class _Copies:
    """The copies one rank holds of rows this rank owns, as their owner follows them.

    Attributes:
        ids: Sorted ids of the copies.
        lag: Updates applied here that each copy has not got (meaningless while stale).
        stale: The holder knows the copy is to be refreshed at its next read (no copy yet, or
            a notice was sent).
    """

    ids: np.ndarray
    lag: np.ndarray
    stale: np.ndarray

    @classmethod
    def all_stale(cls, ids: np.ndarray) -> _Copies:
        """Copies the holder has no value for yet (or no longer trusts): refreshed at first read."""
        return cls(ids, np.zeros(ids.size, np.int64), np.ones(ids.size, bool))


@dataclass
class _Served:
    """What a rank serves as owner in one step's read, and the notices it got as holder."""

    in_fetch: list[np.ndarray]
    in_push: list[np.ndarray]
    in_push_counts: list[np.ndarray]
    notices: np.ndarray
    lags: np.ndarray
    rows: list[torch.Tensor]
    row_sizes: list[int]


class RowExchange:
    """Reads and writes rows of one rank's batches against the owners of a placement."""

    def __init__(
        self,
        comm: Comm,
        store: EmbeddingStore | DeviceStore,
        replicas: ReplicaTable,
        placement: Placement,
        staleness: int,
    ) -> None:
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
        self.dim = store.dim
        self.state_width = store.optimizer.state_width
        self.audit: Audit | None = None
        reps = [r for r in placement.replicas if r.size]
        self._replicated = np.unique(np.concatenate(reps)) if reps else np.zeros(0, np.int64)
        # Owner side: per rank, its copies of rows owned here. Both ends follow the placement
        # and replica table in force at the last sync.
        self._copies: list[_Copies] = []
        self._synced: tuple[Placement, ReplicaTable] | None = None

    def set_replicated(self, ids: np.ndarray) -> None:
        """Rows some rank replicates now (what the audit log follows)."""
        self._replicated = np.asarray(ids, dtype=np.int64)

    def owner_copies(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per rank, the copies it holds of rows owned here as this rank follows them: sorted
        ids, lags and stale flags (the arrays themselves: ``DeviceExchange`` loads them and
        writes them back). As of the last :meth:`sync`."""
        return [(c.ids, c.lag, c.stale) for c in self._copies]

    def log_applied(self, step: int, ids: np.ndarray, src: np.ndarray, counts: np.ndarray, *,
                    after_reads: bool) -> None:
        """Log updates applied to replicated rows in the audit, when one is on (see
        :class:`Audit`)."""
        self._log(step, ids, src, counts, after_reads=after_reads)

    def start_audit(self) -> Audit:
        """Log replica reads and owner updates of replicated rows from now on (tests)."""
        self.audit = Audit([], [])
        return self.audit

    # -- read --------------------------------------------------------------------------------

    def read(self, uniq: np.ndarray, step: int, counters: StepCounters) -> ReadPlan:
        """Rows of the distinct ids ``uniq`` (sorted) for ``step``; owners serve requests.

        Both all-to-alls are left running while the rank does what needs nothing from them:
        its own rows (most of a batch's under a graph placement) while the requests travel,
        its copies read within their bound while the rows come back.
        """
        comm, world = self.comm, self.comm.world
        self.sync()
        req = self._requests(uniq, self._notices())
        received = comm.exchange_counts(req.sent)
        recv_sizes = received[:, 0] + 2 * received[:, 1] + received[:, 2] + received[:, 3]
        request = comm.start_all_to_all(self._ints(req.message), req.sizes, recv_sizes,
                                        "request")
        own_values, _ = self.store.lookup(uniq[req.own], step)
        values = torch.empty((uniq.size, self.dim), dtype=own_values.dtype,
                             device=own_values.device)
        values.index_copy_(0, self._t(req.own), own_values)
        srv = self._serve(received, request.wait().cpu().numpy(), step, counters)
        if srv.notices.size:  # as holder: copies whose owners say they fell more than s behind
            slots = self.replicas.slots(srv.notices)
            if (slots < 0).any():
                raise RuntimeError("an owner sent a notice for a copy this rank does not hold")
            self.replicas.stale[slots] = True
        # After the notices, both ends know which copies read now come with rows, so the rows
        # reply needs no count exchange of its own.
        is_r = req.kind != FETCH
        refresh = self.replicas.stale[req.slots[is_r]]
        n_ref = np.bincount(req.owner[is_r][refresh], minlength=world)
        row_w = self.dim + self.state_width
        rows = comm.start_all_to_all(torch.cat(srv.rows), srv.row_sizes,
                                     req.sent[:, 0] * self.dim + n_ref * row_w, "response")
        fetch_pos, rep_pos = req.order[req.kind == FETCH], req.order[is_r]
        rep_slots = req.slots[is_r]
        kept = np.flatnonzero(~refresh)
        if kept.size:
            values.index_copy_(0, self._t(rep_pos[kept]), self.replicas.read(rep_slots[kept]))
        fetched_rows, fresh_rows = split_rows(rows.wait(), req.sent[:, 0], n_ref, self.dim,
                                               row_w)
        if fetch_pos.size:
            values.index_copy_(0, self._t(fetch_pos), fetched_rows)
        if refresh.any():
            fresh_slots = rep_slots[refresh]
            self.replicas.refresh(fresh_slots, fresh_rows[:, :self.dim], fresh_rows[:, self.dim:])
            values.index_copy_(0, self._t(rep_pos[refresh]), self.replicas.read(fresh_slots))

        # The lag of every read is known to the row's owner, which counts it (job totals add
        # up the same either way).
        counters.staleness = np.bincount(srv.lags, minlength=1).astype(np.int64)
        counters.unique_ids += int(uniq.size)
        counters.owned_reads += int(req.own.size)
        counters.replica_reads += int(rep_pos.size)
        counters.replica_refreshes += int(refresh.sum())
        counters.remote_rows += int(fetch_pos.size)
        if self.audit is not None:
            self.audit.reads.append(np.stack(
                [np.full(rep_pos.size, step), uniq[rep_pos], refresh.astype(np.int64)], 1))
        return ReadPlan(uniq, values, req.own, rep_pos, rep_slots, req.order, req.kind,
                        req.sent, received, srv.in_fetch, srv.in_push, srv.in_push_counts,
                        req.push_counts, step)

    def _requests(self, uniq: np.ndarray, notices: list[np.ndarray]) -> Requests:
        """This rank's requests of the step (with the notices it sends as owner)."""
        owner = self.placement.owner_of(uniq)
        slots = self.replicas.slots(uniq[owner != self.comm.rank])
        return build_requests(uniq, owner, slots, self.replicas.pending, self.s, notices,
                              self.comm.rank, self.comm.world)

    def _serve(self, received: np.ndarray, request: np.ndarray, step: int,
               counters: StepCounters) -> _Served:
        """Owner side of the read: the answer to every requester."""
        in_fetch, in_push, in_push_counts, in_rep, notices = parse_requests(received, request)
        # A copy read within its bound needs no row (the owner keeps its lag): only the copies
        # refreshed now are looked up, with the rows fetched. (Replicated rows are pinned, never
        # evicted, and count as used when released: EmbeddingStore.pin.)
        copies = [self._serve_copies(src, in_rep[src]) for src in range(self.comm.world)]
        refreshed = [ids[fresh] for ids, (fresh, _) in zip(in_rep, copies)]
        served_ids = np.unique(np.concatenate([*in_fetch, *refreshed]))
        served, state = self.store.lookup(served_ids, step, with_state=True)
        assert state is not None
        rows, row_sizes, lags = [], [], []
        for src in range(self.comm.world):
            fetched = self._t(np.searchsorted(served_ids, in_fetch[src]))
            fresh, lag = copies[src]
            lags.append(lag)
            t = self._t(np.searchsorted(served_ids, refreshed[src]))
            rows += [served.index_select(0, fetched).reshape(-1),
                     torch.cat([served.index_select(0, t), state.index_select(0, t)],
                               dim=1).reshape(-1)]
            row_sizes.append(in_fetch[src].size * self.dim
                             + int(fresh.sum()) * (self.dim + self.state_width))
            if src != self.comm.rank:
                counters.rows_served += int(in_fetch[src].size + fresh.sum())
        return _Served(in_fetch, in_push, in_push_counts, np.concatenate(notices),
                       np.concatenate(lags), rows, row_sizes)

    def _serve_copies(self, src: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Owner side of copy reads by ``src``: which get rows (stale ones, now fresh again)
        and the lag of each read (0 for those refreshed)."""
        if ids.size == 0:
            return np.zeros(0, bool), np.zeros(0, np.int64)
        c = self._copies[src]
        pos = find_sorted(c.ids, ids)
        if (pos < 0).any():
            raise RuntimeError(f"rank {src} read copies of rows that are not its replicas of "
                               f"rows owned here (placement out of step)")
        fresh = c.stale[pos]
        lag = np.where(fresh, 0, c.lag[pos])
        c.lag[pos[fresh]] = 0
        c.stale[pos[fresh]] = False
        return fresh, lag

    # -- write -------------------------------------------------------------------------------

    def write(self, plan: ReadPlan, grads: torch.Tensor, counters: StepCounters) -> None:
        """Send gradients to owners, update replicas, and apply the updates this rank owns.

        The gradients leave first; the copies are updated while they travel (the pushes
        among them are computed as they will stand after the update).
        """
        comm, world = self.comm, self.comm.world
        rep_grads = grads.index_select(0, self._t(plan.replica))
        increments = self.replicas.optimizer.increments(rep_grads)
        rep_kind = plan.kind[plan.kind != FETCH]  # aligned with replica / replica_slots
        pushing = np.flatnonzero(rep_kind == PUSH)
        push_slots, at = plan.replica_slots[pushing], self._t(pushing)
        push_grads = rep_grads.index_select(0, at)
        summed, counts = self.replicas.push_with(push_slots, push_grads,
                                                 increments.index_select(0, at))
        if not np.array_equal(counts, plan.push_counts):
            raise RuntimeError("replica push counts changed between read and write")
        # s = 0: a push is this step's gradient, summed by the owner with everyone else's.
        pushes = push_grads if self.s == 0 else summed
        counters.replica_pushes += int(push_slots.size)
        # Per owner: gradients of fetched rows, then the pushes (both in request order).
        fetch_grads = grads.index_select(0, self._t(plan.order[plan.kind == FETCH]))
        f_bounds = np.concatenate([[0], np.cumsum(plan.sent[:, 0])])
        p_bounds = np.concatenate([[0], np.cumsum(plan.sent[:, 1])])
        out = []
        for o in range(world):
            out += [fetch_grads[f_bounds[o]:f_bounds[o + 1]].reshape(-1),
                    pushes[p_bounds[o]:p_bounds[o + 1]].reshape(-1)]
        push_w = self._push_width()
        send_sizes = plan.sent[:, 0] * self.dim + plan.sent[:, 1] * push_w
        recv_sizes = plan.received[:, 0] * self.dim + plan.received[:, 1] * push_w
        arriving = comm.start_all_to_all(torch.cat(out), send_sizes, recv_sizes, "gradient")
        self.replicas.update(plan.replica_slots, rep_grads, increments)
        self.replicas.clear_pending(push_slots)
        incoming = arriving.wait()

        # Owner: one optimizer step per row with this step's gradients (own, fetched, s = 0
        # pushes) plus the replicas' summed gradients and state increments (s > 0).
        g_ids, g_rows, g_src = [plan.uniq[plan.own]], [grads.index_select(0, self._t(plan.own))], [
            np.full(plan.own.size, comm.rank, np.int64)]
        p_ids, p_rows, p_counts, p_src = [], [], [], []
        pos = 0
        for src in range(world):
            n_fetch, n_push = plan.in_fetch[src].size, plan.in_push[src].size
            g_ids.append(plan.in_fetch[src])
            g_rows.append(incoming[pos:pos + n_fetch * self.dim].view(-1, self.dim))
            g_src.append(np.full(n_fetch, src, np.int64))
            pos += n_fetch * self.dim
            block = incoming[pos:pos + n_push * push_w].view(-1, push_w)
            pos += n_push * push_w
            if self.s == 0:
                g_ids.append(plan.in_push[src])
                g_rows.append(block)
                g_src.append(np.full(n_push, src, np.int64))
            else:
                p_ids.append(plan.in_push[src])
                p_rows.append(block)
                p_counts.append(plan.in_push_counts[src])
                p_src.append(np.full(n_push, src, np.int64))
        ids, sources = np.concatenate(g_ids), np.concatenate(g_src)
        self._log(plan.step, ids, sources, np.ones(ids.size, np.int64), after_reads=True)
        pushed = None
        if p_ids:
            pushed = (np.concatenate(p_ids), torch.cat(p_rows), np.concatenate(p_counts),
                      np.concatenate(p_src))
            self._log(plan.step, pushed[0], pushed[3], pushed[2], after_reads=True)
        self._apply(ids, torch.cat(g_rows), sources, pushed)

    def _push_width(self) -> int:
        return self.dim if self.s == 0 else self.dim + self.state_width

    def _log(self, step: int, ids: np.ndarray, src: np.ndarray, counts: np.ndarray, *,
             after_reads: bool) -> None:
        if self.audit is None:
            return
        keep = np.isin(ids, self._replicated)
        n = int(keep.sum())
        self.audit.applied.append(np.stack(
            [np.full(n, step), ids[keep], src[keep], counts[keep], np.full(n, int(after_reads))],
            1))

    def _apply(
        self,
        ids: np.ndarray,
        grads: torch.Tensor,
        src: np.ndarray,
        pushed: tuple[np.ndarray, torch.Tensor, np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """One optimizer step per row: the sum of its gradients plus its replicas' pushes.

        Args:
            ids: Ids of single-update gradients (may repeat: one per contributor).
            grads: ``[len(ids), dim]`` those gradients.
            src: The rank each gradient came from.
            pushed: Replica pushes ``(ids, [k, dim + state_width] summed gradient | summed
                state increments, update counts, source ranks)``.
        """
        width = self.dim + self.state_width
        p_ids = pushed[0] if pushed is not None else np.zeros(0, np.int64)
        uniq, inverse = np.unique(np.concatenate([ids, p_ids]), return_inverse=True)
        if uniq.size == 0:
            return
        direct = torch.zeros((uniq.size, self.dim), dtype=grads.dtype, device=grads.device)
        direct.index_add_(0, self._t(inverse[:ids.size]), grads)
        counts = np.bincount(inverse[:ids.size], minlength=uniq.size).astype(np.int64)
        if pushed is None:
            applied = self.store.apply(uniq, direct, counts)
            self._age(uniq, np.where(applied, counts, 0), inverse, src,
                      np.ones(ids.size, np.int64))
            return
        extra = torch.zeros((uniq.size, width), dtype=grads.dtype, device=grads.device)
        extra.index_add_(0, self._t(inverse[ids.size:]), pushed[1])
        counts += np.bincount(inverse[ids.size:], weights=pushed[2],
                              minlength=uniq.size).astype(np.int64)
        # Rows without a direct gradient this step add nothing but the pushed increments.
        has_direct = torch.from_numpy(np.bincount(inverse[:ids.size], minlength=uniq.size) > 0)
        inc = self.store.optimizer.increments(direct) * has_direct.to(direct.device).unsqueeze(1)
        applied = self.store.apply(uniq, direct + extra[:, :self.dim], counts,
                                   increments=inc + extra[:, self.dim:])
        self._age(uniq, np.where(applied, counts, 0), inverse, np.concatenate([src, pushed[3]]),
                  np.concatenate([np.ones(ids.size, np.int64), pushed[2]]))

    def _age(self, uniq: np.ndarray, counts: np.ndarray, inverse: np.ndarray, src: np.ndarray,
             updates: np.ndarray) -> None:
        """Copies of rows just updated fall behind by every update but their holder's own.

        Args:
            uniq: Rows updated (sorted), ``counts`` the updates each got (0 where the store
                had no row and dropped them).
            inverse: The row (in ``uniq``) of each contribution, ``src`` its rank and
                ``updates`` the updates it stands for.
        """
        for holder, c in enumerate(self._copies):
            if c.ids.size == 0:
                continue
            pos = find_sorted(uniq, c.ids)
            hit = np.flatnonzero(pos >= 0)
            if hit.size == 0:
                continue
            theirs = src == holder
            own = np.bincount(inverse[theirs], weights=updates[theirs], minlength=uniq.size)
            own = np.where(counts > 0, own, 0).astype(np.int64)  # dropped updates count nothing
            c.lag[hit] += counts[pos[hit]] - own[pos[hit]]

    def _notices(self) -> list[np.ndarray]:
        """Per rank, its copies that fell more than ``s`` behind since the last notices (owner
        side); they are stale from now on."""
        out = []
        for c in self._copies:
            new = np.flatnonzero(~c.stale & (c.lag > self.s))
            c.stale[new] = True
            out.append(c.ids[new])
        return out

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
        copies = []
        for holder, reps in enumerate(p.replicas):
            ids = reps[p.owner_of(reps) == me] if holder != me else reps[:0]
            c = _Copies.all_stale(ids)
            if self._copies and self._copies[holder].ids.size and ids.size:
                old = self._copies[holder]
                pos = find_sorted(old.ids, ids)
                kept = np.flatnonzero(pos >= 0)
                c.lag[kept] = old.lag[pos[kept]]
                c.stale[kept] = old.stale[pos[kept]]
            copies.append(c)
        self._copies = copies
        owners = p.owner_of(table.ids).astype(np.int32)
        # What the owners follow must be what this rank holds (the copies of rows it owns are
        # unused until those rows move away): otherwise message sizes would part.
        if not np.array_equal(table.ids[owners != me], p.replicas[me]):
            raise RuntimeError(f"rank {me}: replica table and placement disagree on its copies "
                               f"(replace_replicas and set_placement out of step)")
        if self._synced is not None:  # holder side: a copy whose row moved (new ones are stale)
            table.stale[self._synced[0].owner_of(table.ids) != owners] = True
        self._synced = (p, table)

    # -- flush and read-only -----------------------------------------------------------------

    def flush(self, step: int = -1) -> int:
        """Push pending replica changes to their owners (before evaluation, a checkpoint, or a
        change of replica sets). Collective: every rank calls it.

        Args:
            step: The step the changes are applied at (for the audit log).

        Returns:
            The number of replica rows pushed by this rank.
        """
        comm, world = self.comm, self.comm.world
        self.sync()
        slots = self.replicas.pending_slots()
        ids = self.replicas.ids[slots]
        owner = self.placement.owner_of(ids)
        perm = np.argsort(owner, kind="stable")
        slots, ids, owner = slots[perm], ids[perm], owner[perm]
        summed, counts = self.replicas.take_push(slots)
        width = self.dim + self.state_width
        sent = np.bincount(owner, minlength=world).astype(np.int64)[:, None]
        received = comm.exchange_counts(sent, "flush")[:, 0]
        bounds = np.concatenate([[0], np.cumsum(sent[:, 0])])
        msg = np.concatenate([np.concatenate([ids[bounds[o]:bounds[o + 1]],
                                              counts[bounds[o]:bounds[o + 1]]])
                              for o in range(world)])
        req = comm.all_to_all(self._ints(msg), 2 * sent[:, 0], 2 * received, "flush").cpu().numpy()
        rows_in = comm.all_to_all(summed.reshape(-1), sent[:, 0] * width, received * width,
                                  "flush").view(-1, width)
        in_ids, in_counts, in_src, pos = [], [], [], 0
        for src, n in enumerate(received):
            in_ids.append(req[pos:pos + n])
            in_counts.append(req[pos + n:pos + 2 * n])
            in_src.append(np.full(n, src, np.int64))
            pos += 2 * n
        pushed = (np.concatenate(in_ids), rows_in, np.concatenate(in_counts),
                  np.concatenate(in_src))
        self._log(step, pushed[0], pushed[3], pushed[2], after_reads=False)
        self._apply(np.zeros(0, np.int64), rows_in[:, :0].reshape(0, self.dim),
                    np.zeros(0, np.int64), pushed)
        return int(slots.size)

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
        slots = self.replicas.slots(uniq) if replicas else np.full(uniq.size, -1)
        # A copy stands for its row only where this rank does not own the row (a migration
        # leaves copies of rows still owned here) and has been filled at least once.
        copy = np.flatnonzero(slots >= 0)
        unusable = local[copy] | ~self.replicas.filled[slots[copy]]
        slots[copy[unusable]] = -1
        local |= slots >= 0
        perm = np.argsort(owner, kind="stable")
        perm = perm[~local[perm]]
        sent = np.bincount(owner[perm], minlength=world).astype(np.int64)
        received = comm.exchange_counts(sent[:, None], "eval")[:, 0]
        req = comm.all_to_all(self._ints(uniq[perm]), sent, received, "eval").cpu().numpy()
        rows = self.store.peek(req).reshape(-1)
        rows_in = comm.all_to_all(rows, received * self.dim, sent * self.dim, "eval")
        values = self.store.peek(uniq)  # owned rows (and placeholders for the rest)
        if perm.size:
            values[self._t(perm)] = rows_in.view(-1, self.dim)
        copies = np.flatnonzero(slots >= 0)
        if copies.size:
            values[self._t(copies)] = self.replicas.read(slots[copies])
        return values

    # -- helpers -----------------------------------------------------------------------------

    def _t(self, index: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(index, dtype=np.int64)).to(self.comm.device)

    def _ints(self, values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).to(self.comm.device)

    def _floats(self, n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=self.store.dtype, device=self.comm.device)

