"""One rank's training step: route samples, read rows, forward/backward, write rows, average dense.

:class:`Trainer` is the same object in single-process training (with
:class:`~hetgmp.trainer.dist.comm.LocalComm`) and in every rank of a job (with
:class:`~hetgmp.trainer.dist.comm.DistComm`); only the placement and the communicator differ. That is what
makes invariant 3 testable: with ``s = 0``, N ranks compute what one process computes on the
same global batches, up to float summation order.

The loss of a step is the summed log-loss of the global batch divided by its size, whatever
rank a sample lands on; so the dense gradients summed over ranks (one all-reduce) are the
global batch's gradient, and each rank applies the same dense optimizer step to the same
values (all-reduce gives every rank the same bits), keeping the dense copies identical.

That all-reduce is left running when :meth:`Trainer.step` returns, and the update is applied
at the start of the next step, after the work that needs neither peers nor dense parameters
(routing the batch, or deduplicating its ids when samples are not routed): on CPU the rank
would otherwise sit idle while gloo moves the gradients. The result is the same, since nothing
reads the dense parameters in between (:meth:`Trainer.finish_step`). Measured by the train
benchmark (2 ranks on 2 shared cores, 586 steps): the dense phase fell from 5.1-5.6 s a run to
2.3-2.6 s, in every distributed configuration.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hetgmp.partitioner import Placement, capacity
from hetgmp.runtime import Clock, SystemClock
from hetgmp.streaming import ClickBatch
from hetgmp.trainer.dist import PHASES, Comm, Pending, StepCounters, Totals, Traffic
from hetgmp.trainer.embedding import EmbeddingStore, ReplicaTable, RowExchange, StoreConfig, unique_padded
from hetgmp.trainer.model import (
    Bags,
    DenseOptimizer,
    Features,
    FieldReader,
    FlatParameters,
    ModelConfig,
    ModelSpec,
    Widths,
    build_model,
)
from hetgmp.trainer.step.config import TrainConfig, scaled
from hetgmp.trainer.step.message import pack_ids, pack_lists, unpack_ids, unpack_lists
from hetgmp.trainer.step.route_choice import RouteChoice
from hetgmp.trainer.step.transfer import to_device

__all__ = ["Trainer", "ModelState"]

# Eviction scans every row, so it runs every few steps rather than every step; rows then live
# up to this many steps past ``evict_after``.
_MAINTAIN_EVERY = 16


@dataclass
class ModelState:
    """A rank's part of the model: dense parameters (replicated) and the rows it owns."""

    dense: dict[str, torch.Tensor]
    ids: np.ndarray
    rows: torch.Tensor
    versions: np.ndarray


@dataclass
class _Prepared:
    """A step's work done before the last step's dense update is finished (see ``_prepare``).

    Attributes:
        dest: Routing on: the rank each sample read here goes to, and ``packed`` the samples
            sorted by it (the routing message).
    """

    dest: np.ndarray | None = None
    packed: np.ndarray | None = None
    words: np.ndarray | None = None  # jagged: int64 words of each rank's block of ``packed``


class Trainer:
    """A rank's model, embedding store, replicas and step loop state."""

    def __init__(
        self,
        comm: Comm,
        placement: Placement,
        n_fields: int,
        n_dense: int,
        *,
        model: ModelConfig | None = None,
        store: StoreConfig | None = None,
        train: TrainConfig | None = None,
        bags: Bags | None = None,
        clock: Clock | None = None,
    ) -> None:
        """Build the rank's state; every rank of a job must construct it with equal arguments.

        Args:
            comm: Collectives of the job (``LocalComm`` for single-process training).
            placement: Owners and replicas of rows, for ``comm.world`` ranks.
            n_fields: Sparse fields per sample.
            n_dense: Dense features per sample.
            model: Model settings.
            store: Embedding store settings.
            train: Loop settings (staleness, routing, dense optimizer).
            bags: How the sparse fields pool (``Bags.of(schema)``); default: one value a
                field, summed.
            clock: Time source of the per-phase step timings.
        """
        self.comm = comm
        self._clock = clock or SystemClock()
        self.placement = placement
        self.model_config = mc = model or ModelConfig()
        # --batch-scaling sets learning rates, L2 and the clip from the global batch.
        self.scaling = scaled(train or TrainConfig(), store or StoreConfig())
        self.train_config = tc = self.scaling.train
        store = self.scaling.store
        self.bags = bags = bags or Bags()
        if bags.mean and len(bags.mean) != n_fields:
            raise ValueError(f"pooling given for {len(bags.mean)} fields, the model has {n_fields}")
        # Tables of several widths: rows stored in blocks of one width (trainer.model.widths);
        # a batch is routed as read and expanded after, to a column of ids a block.
        self.reader = FieldReader.of(bags, mc, n_fields, comm.device)
        self.n_fields, self.n_dense = n_fields, n_dense
        self.dtype = torch.float64 if mc.dtype == "float64" else torch.float32
        device = comm.device
        self.spec = ModelSpec.of_bags(mc, bags, n_fields, n_dense)
        self.model: nn.Module = build_model(mc, n_fields, n_dense, self.spec).to(device)
        self.dense = FlatParameters(self.model)
        # The training forward (public for benchmarks): the model itself, or its torch.compile'd
        # twin (the same module and parameters).
        self.train_forward: Callable[[Features], torch.Tensor] = (
            torch.compile(self.model, dynamic=True) if mc.compile == "on" else self.model)
        # Same seed gives the same values; the broadcast makes it so even across machines
        # whose torch builds might draw differently.
        comm.broadcast_(self.dense.flat, src=0)
        self.store = EmbeddingStore(self.widths.row_dim, store, dtype=self.dtype, device=device)
        replicated = [r for r in placement.replicas if r.size]
        if replicated:
            self.store.pin(np.unique(np.concatenate(replicated)))
        self.replicas = ReplicaTable(placement.replicas[comm.rank], self.widths.row_dim,
                                     self.store.optimizer, dtype=self.dtype, device=device)
        self.exchange = RowExchange(comm, self.store, self.replicas, placement, tc.staleness)
        self.optimizer = DenseOptimizer(tc.dense_optimizer, tc.dense_lr, self.dense.flat,
                                        warmup_steps=self.scaling.warmup_steps)
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
        # Several labels: the loss is each task's summed loss times its weight, summed.
        self.tasks = self.spec.tasks
        self._task_weights = (torch.tensor(tc.loss_weights(self.tasks), dtype=self.dtype,
                                           device=device) if self.tasks > 1 else None)
        self.step_index = 0
        self._totals = Totals()
        self.routes = tc.routes and comm.world > 1
        # Routing: a rank's share of the global batch, the most samples it may route to one
        # rank, and whether the last global batch was whole (see _send_with_header).
        self._share = max(1, -(-tc.global_batch // comm.world))
        self._block = capacity(self._share, comm.world, tc.route_epsilon)
        self._whole_batches = False
        # Batch-aware routing or not (--route-rounds; measured on this rank's batches when
        # auto).
        self.route_choice = RouteChoice(tc.route_rounds, comm.rank, self._clock.monotonic)
        self.last_logits = torch.zeros(0)
        no_labels = np.zeros((0,) if self.tasks == 1 else (0, self.tasks), np.float32)
        self.last_labels = no_labels
        self.last_dest: np.ndarray | None = None
        self.last_routed_in = ClickBatch.of_ids(no_labels,
                                                np.zeros((0, n_dense), np.float32),
                                                np.zeros((0, self.n_fields), np.int64))
        # The last step's dense all-reduce, left running, and its buffer (see finish_step).
        self._dense_pending: tuple[Pending, torch.Tensor] | None = None
        # The last step's summed loss and its samples, read back with the next step's counts
        # (the exchange's first wait) or by finish_step.
        self._loss_pending: tuple[torch.Tensor, int] | None = None
        # That loss read back (by finish_step) before a step's counters carried it.
        self._loss_ready: tuple[float, int] | None = None

    # -- training ----------------------------------------------------------------------------

    def step(self, batch: ClickBatch, exhausted: bool = False) -> StepCounters | None:
        """Train one step on this rank's share of the global batch.

        Every rank calls it once per step (a rank with nothing to train passes an empty batch).
        The batch's ids go to the device once; they are deduplicated and their rows read and
        updated there (:class:`~hetgmp.trainer.embedding.RowExchange`): the host waits for the
        device once a step at one rank, twice at more. The step's loss is read back with the
        next step's first wait, so a step's counters carry the loss of the step before.

        Args:
            batch: The samples this rank read for the step (may be empty).
            exhausted: This rank's source has ended.

        Returns:
            The step's counters (``global_samples == 0``: no rank had samples, nothing was
            trained and the step does not count), or None when moreover every rank's source
            has ended (the job is over).
        """
        c = StepCounters(samples_read=len(batch))
        before = self.comm.traffic.copy()
        tick = self._clock.monotonic
        t0 = tick()
        # What needs neither a peer nor the dense parameters runs while the last step's dense
        # all-reduce is still on the wire; then that step's dense update is applied.
        prep = self._prepare(batch)
        waited = self._finish_dense()
        routed = self._route(batch, exhausted, c, prep)
        if routed is None or routed[1] == 0:
            # Not a counted step (no rank had samples): what it sent and waited for still is.
            self._book(before, waited)
            return None if routed is None else c
        local, global_n = routed
        local = self.blocks(local)
        t1 = tick()
        ids = to_device(local.values, self.store.device)
        u = unique_padded(ids)
        padded, inverse, count = u.ids, u.inverse, u.n
        pending = self._loss_pending
        plan = self.exchange.read(padded, count, self.step_index, c,
                                  None if pending is None else pending[0])
        self._carry_loss(c, plan.extra)
        t2 = tick()
        loss_sum, row_grads, dense_grads = self._backward(local, global_n, plan.values, inverse,
                                                          (u.order, u.rank))
        opt = self.store.optimizer
        if opt.config.l2 or opt.count_width:  # each row's occurrences: L2, CowClip's count
            n = torch.zeros(len(plan.values), dtype=torch.int64, device=inverse.device)
            row_grads = opt.gradients(row_grads, plan.values,
                                      n.index_add_(0, inverse, torch.ones_like(inverse)), global_n)
        opt.lr_factor = self.scaling.row_lr_factor(self.step_index)
        t3 = tick()
        self.exchange.write(plan, row_grads, c)
        t4 = tick()
        return self._end_step(c, before, local, loss_sum, dense_grads,
                              (t0, t1, t2, t3, t4, waited))

    @property
    def widths(self) -> Widths:
        """Each field's row width, and the blocks the rows are stored in."""
        return self.reader.widths

    def blocks(self, batch: ClickBatch) -> ClickBatch:
        """``batch`` with a column of ids a block of each field's rows, as the trainer reads
        it (``widths.expand``; a batch expanded already is returned as it is).

        Raises:
            ValueError: ``batch`` has neither a column a field nor a column a block.
        """
        if batch.fields == self.widths.columns:
            return batch
        return self.widths.expand(batch)

    def prefetch(self, ids: np.ndarray, now: ClickBatch) -> None:
        """Read ahead, on a thread, the spilled rows of the ids (the next batch's) this rank
        owns and the step about to train on ``now`` does not bring back itself (a disk tier
        only; a hint: the step reads what it needs either way)."""
        if not self.store.prefetching or not ids.size:
            return
        ids = np.setdiff1d(ids, now.values)
        self.store.prefetch(ids[self.placement.owner_of(ids) == self.comm.rank])

    def _carry_loss(self, c: StepCounters, read: list[float]) -> None:
        """Put the last step's loss in ``c``: ``read`` with this step's counts, or read back
        already by finish_step."""
        if self._loss_pending is not None:
            c.loss_sum, c.loss_samples = read[0], self._loss_pending[1]
            self._loss_pending = None
        elif self._loss_ready is not None:
            (c.loss_sum, c.loss_samples), self._loss_ready = self._loss_ready, None

    def _settle_loss(self) -> None:
        """Read the last step's loss back, for the next step's counters to carry (or
        the totals, when read before one does)."""
        if self._loss_pending is not None:
            loss, samples = self._loss_pending
            self._loss_pending = None
            self._loss_ready = (float(loss), samples)

    @property
    def totals(self) -> Totals:
        """This rank's counters summed over its steps. A loss that :meth:`finish_step` read
        back, and no step's counters carried yet, is booked here."""
        if self._loss_ready is not None:
            (loss, samples), self._loss_ready = self._loss_ready, None
            self._totals.loss_sum += loss
            self._totals.loss_samples += samples
        return self._totals

    @property
    def loss_finite(self) -> bool:
        """Whether the last step's loss is finite (NaN or infinite: the model diverged). It is
        read back first (one wait): call it where that is worth a wait, before a checkpoint or
        a publish, since the step's counters carry each loss a step late."""
        self._settle_loss()
        return self._loss_ready is None or math.isfinite(self._loss_ready[0])

    def _backward(self, local: ClickBatch, global_n: int, values: torch.Tensor,
                  inverse: torch.Tensor, by_row: tuple[torch.Tensor, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor | None, ...]]:
        """Forward and backward on the batch's rows (``values[inverse]``; ``by_row``: the
        deduplication's order and rank, see :func:`~hetgmp.trainer.model.pool_bags`): (summed loss,
        each distinct row's gradient, the dense parameters' gradients)."""
        if local.one_value:
            # The batch's rows are the leaf: its gradient is each row's gradient summed over
            # its occurrences (index_add_ on CPU beats autograd's scatter for the gather's
            # backward).
            rows = values.index_select(0, inverse)
            rows.requires_grad_(True)
            features = self.features(rows, local)
        else:
            # The distinct rows are the leaf: the fused bag kernel reads them where they lie
            # and its backward sums each one's gradient (trainer.model.pooling).
            rows = values.detach().requires_grad_(True)
            features = self.features(rows, local, inverse, by_row)
        with self.model_autocast():
            logits = self.train_forward(features)
        logits = _one_column(logits)
        logits = logits.to(self.dtype)
        labels = to_device(local.labels, self.comm.device, self.dtype)
        if self._task_weights is None:
            loss_sum = self.loss_fn(logits, labels)  # summed over this rank's samples
        else:  # [B, T]: each task's loss weighted, summed over samples and tasks
            loss_sum = F.binary_cross_entropy_with_logits(
                logits, labels, weight=self._task_weights, reduction="sum")
        loss = loss_sum / global_n
        grads = torch.autograd.grad(loss, [rows, *self.dense.params], allow_unused=True)
        if not local.one_value:
            row_grads = torch.zeros_like(values) if grads[0] is None else grads[0]
        else:
            row_grads = torch.zeros_like(values)
            if grads[0] is not None:
                row_grads.index_add_(0, inverse, grads[0])
        self.last_logits = logits.detach()
        return loss_sum, row_grads, grads[1:]

    def features(self, rows: torch.Tensor, batch: ClickBatch, index: torch.Tensor | None = None,
                 by_row: tuple[torch.Tensor, torch.Tensor] | None = None) -> Features:
        """What the model reads from the batch's looked-up rows: ``[nnz, R]`` in the order of
        ``batch.values``, or with ``index`` (the row of each value; ``by_row``: it sorted, see
        :func:`~hetgmp.trainer.model.pool_bags`) its distinct rows; pooled fields, sequence
        fields, dense features, each field's row joined from its blocks."""
        weights = None if batch.weights is None else to_device(batch.weights, rows.device)
        return self.reader.features(rows, to_device(batch.lengths, rows.device),
                                    self._dense_tensor(batch.dense), weights=weights,
                                    index=index, by_row=by_row, one_value=batch.one_value)

    def model_autocast(self) -> torch.autocast:
        """The model's forward under bf16 autocast with ``--autocast bf16`` (else disabled)."""
        return torch.autocast(self.comm.device.type, dtype=torch.bfloat16,
                              enabled=self.model_config.autocast == "bf16")

    def _end_step(self, c: StepCounters, before: Traffic, local: ClickBatch,
                  loss_sum: torch.Tensor, dense_grads: tuple[torch.Tensor | None, ...],
                  times: tuple[float, ...]) -> StepCounters:
        """What every step does after its rows are written: the dense all-reduce left running,
        the phase times, the store's upkeep, the totals."""
        t0, t1, t2, t3, t4, waited = times
        # The dense gradients are summed over ranks while the next step routes its batch
        # (finish_step applies them, before anything uses the dense parameters).
        flat = torch.cat(self.dense.flat_grads(dense_grads))
        self._dense_pending = (self.comm.start_all_reduce_sum(flat), flat)
        # The loss stays on the device: the next step's first wait reads it. Time is booked
        # where it is spent: the wait for the last step's all-reduce (and its update) in this
        # step's dense phase, not in its routing.
        self._loss_pending = (loss_sum.detach(), c.samples_trained)
        tick = self._clock.monotonic
        c.seconds = np.array([t1 - t0 - waited, t2 - t1, t3 - t2, t4 - t3, tick() - t4 + waited])
        self.step_index += 1
        cfg = self.store.config
        # The cap is checked every step (the rows a step created pushed the store over it at
        # most), the idle-row scan every few.
        if self.store.over_cap or (cfg.evict_after or cfg.max_rows) and \
                self.step_index % _MAINTAIN_EVERY == 0:
            self.store.maintain(self.step_index)
        c.traffic = self.comm.traffic - before
        # The batch read went through route_choice when routing is on and it had samples
        # (_prepare).
        read, write = PHASES.index("read"), PHASES.index("write")
        self.route_choice.on_step(float(c.seconds[read] + c.seconds[write]), c.rows_not_held,
                                  routed=self.routes and c.samples_read > 0)
        self._totals.add(c)
        self.last_labels = local.labels
        return c

    def finish_step(self) -> None:
        """Apply the last step's dense update, once its all-reduce is done.

        :meth:`step` leaves the all-reduce running; the next step, and every method that uses
        the dense parameters (:meth:`predict`, :meth:`state`, :meth:`flush`), finish it first.
        Call it before reading ``model`` or ``dense`` directly, and when training ends. The
        wait and the all-reduce's bytes go to the totals (the dense phase and traffic), as they
        would have in a step. It also reads the last step's loss back: the next step's counters
        carry it, or :attr:`totals` books it.
        """
        before = self.comm.traffic.copy()
        self._book(before, self._finish_dense())
        self._settle_loss()

    def _finish_dense(self) -> float:
        """Wait for the pending all-reduce and apply the update; the seconds it took."""
        if self._dense_pending is None:
            return 0.0
        began = self._clock.monotonic()
        pending, flat = self._dense_pending
        self._dense_pending = None
        pending.wait()
        self.optimizer.step(self.dense.flat, flat)
        return self._clock.monotonic() - began

    def _book(self, before: Traffic, dense_seconds: float) -> None:
        """Count in the totals what was sent since ``before`` and ``dense_seconds``, outside
        any counted step."""
        self._totals.seconds[PHASES.index("dense")] += dense_seconds
        self._totals.traffic = self._totals.traffic + (self.comm.traffic - before)

    def _prepare(self, batch: ClickBatch) -> _Prepared:
        """The step's work that needs no collective and no dense parameter."""
        n = len(batch)
        if not self.routes:
            return _Prepared()
        if n > self._share:
            raise ValueError(f"rank {self.comm.rank} was given {n} samples, more than its "
                             f"share of the global batch ({self._share} of "
                             f"{self.train_config.global_batch})")
        tc = self.train_config
        samples = (batch.indptr, batch.values)
        if n:
            dest = self.route_choice.destinations(samples, self.placement, tc.route_epsilon)
        else:
            dest = np.zeros(0, dtype=np.int32)
        ordered = batch.take(np.argsort(dest, kind="stable"))
        if not self.bags.jagged:
            return _Prepared(dest=dest, packed=pack_ids(ordered))
        packed, words = pack_lists(ordered, np.bincount(dest, minlength=self.comm.world),
                                     self.bags.weighted)
        return _Prepared(dest=dest, packed=packed, words=words)

    def _route(
        self, batch: ClickBatch, exhausted: bool, c: StepCounters, prep: _Prepared
    ) -> tuple[ClickBatch, int] | None:
        """Send samples to the rank that holds most of their rows (when routing is on)."""
        comm, me, world = self.comm, self.comm.rank, self.comm.world
        n = len(batch)
        dest = prep.dest if prep.dest is not None else np.full(n, me, dtype=np.int32)
        counts = np.bincount(dest, minlength=world).astype(np.int64)
        columns = [counts, np.full(world, n), np.full(world, int(exhausted))]
        if self.bags.jagged:  # and the words of each rank's block
            columns.append(prep.words if prep.words is not None else np.zeros(world, np.int64))
        header = np.stack(columns, axis=1)
        packed = prep.packed
        received = None
        # Blocks of a fixed size (one collective) hold one-value samples only.
        if packed is not None and self._whole_batches and not self.bags.jagged:
            heard, received = self._send_with_header(header, packed)
        else:
            heard = comm.exchange_counts(header, "header")
        global_n = int(heard[:, 1].sum())
        # Every rank hears every rank's batch size, so all take the same path next step.
        self._whole_batches = global_n >= self.train_config.global_batch
        if global_n == 0:
            return None if bool(heard[:, 2].all()) else (batch, 0)
        c.global_samples = global_n
        c.samples_routed_out = int(n - counts[me])
        if packed is None:
            c.samples_trained = n
            self.last_dest = None
            self.last_routed_in = self.last_routed_in.take(slice(0, 0))
            return batch, global_n
        if prep.words is not None:  # jagged
            received = comm.host_all_to_all(packed, prep.words, heard[:, 3], "route")
            local = unpack_lists(received, heard[:, 0], heard[:, 3], self.n_fields,
                                 self.n_dense, self.bags.weighted, self.tasks)
        else:
            if received is None:
                received = comm.host_all_to_all(packed, counts, heard[:, 0], "route")
            local = unpack_ids(received, self.n_fields, self.n_dense, self.tasks)
        c.samples_trained = len(local)
        # Which of the samples read here went to rank 0, and the ids of those other ranks
        # routed here: rank 0 holds these already (the online loop's window need not resend).
        self.last_dest = dest
        bounds = np.concatenate([[0], np.cumsum(heard[:, 0])])
        mine = np.zeros(len(local), dtype=bool)
        mine[bounds[me]:bounds[me + 1]] = True
        self.last_routed_in = local.take(~mine)
        return local, global_n

    def _send_with_header(
        self, header: np.ndarray, packed: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The header and the routed samples in one all-to-all (one collective, not two).

        Every block has room for the most samples routing can send one rank from a full share
        (``_block``), so its size is known without a count exchange. Used while the previous
        step's global batch was whole: then, with ``route_epsilon = 0``, a share splits into
        blocks that are exactly full and nothing is padded; a stream that delivers partial
        batches keeps the two-collective path and sends no padding.

        Returns:
            The header each rank sent here (``[world, 3]``) and the samples, by source rank.
        """
        comm, world = self.comm, self.comm.world
        width, start = packed.shape[1], header.shape[1]
        size = start + self._block * width
        message = np.zeros((world, size), dtype=np.int64)
        message[:, :start] = header
        bounds = np.concatenate([[0], np.cumsum(header[:, 0])])
        for dest in range(world):
            rows = packed[bounds[dest]:bounds[dest + 1]].ravel()
            message[dest, start:start + rows.size] = rows
        out = comm.host_all_to_all(message.ravel(), [size] * world, [size] * world,
                                   "route").reshape(world, size)
        heard = out[:, :start].copy()
        received = np.concatenate([out[src, start:start + heard[src, 0] * width]
                                   for src in range(world)]).reshape(-1, width)
        return heard, received

    def _dense_tensor(self, dense: np.ndarray) -> torch.Tensor:
        return to_device(dense, self.comm.device, self.dtype)

    # -- placement changes (between steps) ---------------------------------------------------

    def set_placement(self, placement: Placement) -> None:
        """Route and read by ``placement``'s owners from the next step on.

        The store must already hold the rows ``placement`` gives this rank (see
        :mod:`hetgmp.trainer.embedding.migrate`); replica sets are changed by :meth:`replace_replicas`.
        """
        if placement.num_workers != self.comm.world:
            raise ValueError(f"placement for {placement.num_workers} ranks, job has "
                             f"{self.comm.world}")
        self.placement = placement
        self.exchange.placement = placement

    def replace_replicas(self, replicas: tuple[np.ndarray, ...]) -> None:
        """Hold the copies ``replicas[rank]`` from now on (every rank's set given).

        Copies in both the old and the new set are kept with their values, optimizer state
        and staleness; new ones start empty (filled at first read). Every pending
        update must have been pushed first (:meth:`flush`), or it would be lost.
        """
        old = self.replicas
        if old.pending_slots().numel():
            raise RuntimeError("replica updates still pending: flush before replacing replicas")
        mine = replicas[self.comm.rank]
        table = ReplicaTable(mine, self.widths.row_dim, self.store.optimizer,
                             dtype=self.dtype, device=self.comm.device)
        table.keep(old)
        used = [r for r in replicas if r.size]
        replicated = np.unique(np.concatenate(used)) if used else np.zeros(0, np.int64)
        self.store.pin(replicated)
        self.replicas = table
        self.exchange.replicas = table
        self.exchange.set_replicated(replicated)

    # -- evaluation and state ----------------------------------------------------------------

    def flush(self) -> int:
        """Push pending replica updates so that owners hold every update (collective)."""
        self.finish_step()
        return self.exchange.flush(self.step_index)

    @torch.no_grad()
    def predict(self, batch: ClickBatch, *, local_view: bool = False) -> np.ndarray:
        """Click probabilities of this rank's samples (collective: every rank calls it the
        same number of times).

        Args:
            batch: Samples to score.
            local_view: Use this rank's replicas for the rows it replicates (the view it trains
                with) rather than the owners' rows; call :meth:`flush` first for the latter to
                include every update.
        """
        self.finish_step()
        batch = self.blocks(batch)
        uniq, inverse = np.unique(batch.values, return_inverse=True)
        rows = self.exchange.read_only(uniq, replicas=local_view)
        index = torch.from_numpy(inverse.reshape(-1)).to(rows.device)
        logits = _one_column(self.model(self.features(rows, batch, index)))
        return torch.sigmoid(logits).cpu().numpy().astype(np.float64)

    def state(self) -> ModelState:
        """This rank's dense parameters and owned rows (flush first for a complete picture)."""
        self.finish_step()
        ids, rows, _, versions = self.store.export()
        dense = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return ModelState(dense, ids, rows.cpu(), versions)


def _one_column(logits: torch.Tensor) -> torch.Tensor:
    """Logits ``[B]`` of a model that returns ``[B]`` or ``[B, 1]``."""
    return logits.squeeze(-1) if logits.dim() == 2 and logits.shape[1] == 1 else logits
