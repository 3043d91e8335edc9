"""Communication benchmark of the placement strategies on the synthetic drifting stream.

Protocol (one run, every strategy on the same records):

* The stream is ``streaming.synthetic.SyntheticStream`` with its default shape (only ``--seed``
  changes it). Period ``t`` covers records ``W + t*P .. W + (t+1)*P - 1``; its placement is
  computed, before the period starts, from the window of the ``W`` records that precede it.
  Scoring a placement on records it has not seen is what an online system lives with: ids first
  seen in the period sit on their default owner, and the period after a drift is scored with a
  placement from before it.
* Strategies: ``hash`` (row-wise hash sharding as in TorchRec/HugeCTR: no explicit owners, no
  replicas, samples split in arrival order), ``static`` (one full METIS partition of the first
  window, never updated: HET-GMP's offline approach), ``full`` (a full repartition every
  period: the quality ceiling), ``incremental`` (ours: refine the current placement every
  period, starting from the same first full partition) and ``hetgmp-paper`` (HET-GMP's own
  algorithm as its paper describes it, ``bench.hetgmp_paper``: one partition of the first
  window from a random start, never updated, its replicas ranked its way under the same
  budget). ``--strategy`` runs some of them (hash always).
* Each period is cut into global batches of ``--global-batch`` samples; every non-hash strategy
  routes each batch with ``partitioner.route`` (capacity 1.05 x the mean). Remote rows per
  sample: per worker batch, the distinct ids neither owned nor replicated there, summed over
  workers, over the samples (HET-GMP's measure).
* Migration and time count the repartitions after the first placement (the first one, from the
  hash placement, is the same job for static, full and incremental and is reported apart).
  ``imbalance`` is the worst over periods of the step sample imbalance and of the rows stored
  per worker (owned + replicas) over the ids the window uses.
* ``after_drift``: the periods that start at or after the first drift boundary at or past the
  first window's end, i.e. the periods no first-window partition has seen the like of.
* Where remote rows come from: ``remote_share_unseen_ids`` is the share of a strategy's remote
  rows whose id the window before the period never saw (they sit on their default owner
  whatever the placement), ``remote_share_ids_seen_once`` the share whose id it saw in one
  sample (below the partitioners' ``min_count``). The rest are ids the partitioner saw and
  placed or replicated elsewhere. At 4 / 8 workers (defaults, 5 periods, incremental): 20.6% /
  17.3% unseen, 5.4% / 4.3% seen once.

* ``--oracle`` adds ``segments``, a reference that is not a strategy an online system could
  run: it reads the generator's own community label of every window sample, sends each
  segment whole to a worker (largest first to the least loaded), owns each id where its
  samples went, then balances rows and picks replicas as the others do. The user shapes
  (``user_item``, ``user_history``) have no communities: there the label is the sample's
  user, so the oracle keeps each user's samples, and the items of its taste and history,
  together. It is scored like
  the others, on the next period (with ``--offline``: on the records themselves, once per
  budget), and shows how far placement quality alone can go on this stream (its rows go to
  ``"ceiling"`` in the JSON, not ``"rows"``).

* ``--offline`` runs HET-GMP's own protocol instead, the one behind the figures quoted for the
  official HET-GMP partitioner (74% / 81% fewer remote rows than hash at 4 / 8 workers, with 1%
  replicas, offline, on 500k records of a static stream of this shape): the generator's shape
  with drift turned off, ``--records`` records (default 500k), one full partition of all of
  them (every id placed: ``min_count`` 1, since an offline partitioner sees every sample it is
  scored on), scored on those same records. It runs the partition twice, with the replica
  budget counted against the rows each worker touches (ours) and against all the records' rows,
  here the whole table (``replica_basis="window"``), since which of the two "1%" means for
  HET-GMP changes the figure a lot. ``incremental`` then repairs each static placement with
  ``--offline-passes`` passes of the incremental partitioner over the same records (what the
  online loop does once a period; here every record is new to it, so each pass looks at all of
  them), scored after every pass; its row is the last pass's, with the rows the passes moved.
  HET-GMP's offline partitioner also refines its METIS cut with alternating greedy passes;
  ``static`` is METIS and replicas alone. ``hetgmp-paper`` rows (``bench.partition_offline``)
  are that algorithm's own partition, once per worker count, with the replicas of each budget;
  they carry its ``cost_by_round``. JSON rows carry ``replica_basis`` and the mean
  ``replicas_per_worker``, the summary ``"protocol": "offline"``.

Every row carries ``seconds`` (offline: the strategy's partitioning time; rolling: the mean
repartition) and ``peak_mem_mb``, the process's peak resident memory during its partitions
(Linux's high-water mark, reset before each; the records and the window are resident too).

The last line printed is the JSON summary ``{"bench": "partition", "rows": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.memory import peak_mb, reset_peak
from bench.records import _Records, dense_records
from bench.sweep import add_flags as add_sweep_flags
from bench.sweep import check_flags as check_sweep_flags
from bench.sweep import main_sweep
from hetgmp.partitioner import (
    FullPartitioner,
    IncrementalPartitioner,
    PartitionConfig,
    Partitioner,
    Placement,
    WindowGraph,
    imbalance,
    plan_diff,
    remote_ids,
    route,
    route_batch,
    row_imbalance,
)
from hetgmp.partitioner.assemble import build_placement
from hetgmp.partitioner.graph import compact, per_worker_counts
from hetgmp.partitioner.hetgmp import PaperPartitioner
from hetgmp.partitioner.types import REPLICA_BASES, find_sorted
from hetgmp.streaming.synthetic import SHAPES, SyntheticBlock, SyntheticStream

__all__ = ["build_parser", "main", "parse_args"]

PAPER = "hetgmp-paper"
STRATEGIES = ("hash", "static", "full", "incremental", PAPER)
# Strategies that partition the first window only (offline approaches), never updated.
ONCE = ("static", PAPER)
OFFLINE_STRATEGIES = ("hash", "static", "incremental", PAPER)
ORACLE = "segments"
NUMBERINGS = ("hashed", "dense")


def _labels(stream: SyntheticStream, block: SyntheticBlock) -> np.ndarray:
    """What the oracle groups by: the planted community, or the user where there is none."""
    if stream.config.shape in ("user_item", "user_history"):
        return block.values[:, 0].astype(np.int64)
    return block.segment.astype(np.int64)


@dataclass
class _Track:
    """What one strategy accumulates over the periods of one worker count."""

    remote: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    imbalance: list[float] = field(default_factory=list)
    migrated: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    peak_mb: list[float] = field(default_factory=list)
    initial_rows: int = 0
    initial_seconds: float = 0.0
    # Incremental only: row moves of its passes by step (PassReport), summed over the periods.
    pass_moves: dict[str, int] = field(default_factory=dict)
    # Remote rows whose id the window had never seen, had seen in one sample, in more.
    seen_classes: np.ndarray = field(default_factory=lambda: np.zeros(3, dtype=np.int64))


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (``hetgmp bench all`` reads them to hand each benchmark its own)."""
    parser = argparse.ArgumentParser(
        prog="hetgmp bench partition",
        description="Remote rows per sample, imbalance, migration and repartition time of the "
                    "hash, static, full, incremental and hetgmp-paper placements on the synthetic "
                    "stream.")
    parser.add_argument("--workers", default="4,8", help="comma-separated worker counts")
    parser.add_argument("--window", type=int, default=200_000, help="window samples (W)")
    parser.add_argument("--global-batch", type=int, default=8192, help="samples per step")
    parser.add_argument("--periods", type=int, default=10, help="periods scored (>= 1)")
    parser.add_argument("--period-records", type=int, default=50_000,
                        help="records per period (P)")
    parser.add_argument("--seed", type=int, default=0, help="stream and partitioner seed")
    parser.add_argument("--metis-seed", type=int, default=None,
                        help="--offline: the partitioner's seed alone (METIS's and every "
                             "tie-break), the stream staying --seed's (default: --seed)")
    parser.add_argument("--row-bytes", type=int, default=512,
                        help="bytes per migrated row (e.g. 64 float32 + Adagrad state)")
    parser.add_argument("--oracle", action="store_true",
                        help="also score 'segments', a placement built from the generator's own "
                             "community labels: a ceiling for placement quality, not a strategy")
    parser.add_argument("--replica-fraction", type=float, default=0.01,
                        help="replica budget per worker (default 1%%)")
    parser.add_argument("--replica-basis", choices=REPLICA_BASES, default=None,
                        help="what the budget is a fraction of: all the window's rows "
                             "(default, HET-GMP's count) or the rows a worker's samples touch; "
                             "--offline runs both unless one is named")
    parser.add_argument("--offline", action="store_true",
                        help="HET-GMP's protocol instead: one partition of a static stream, "
                             "scored on the records it was computed from, with the budget "
                             "counted both ways (see the module docstring) or the one "
                             "--replica-basis names")
    parser.add_argument("--records", type=int, default=500_000,
                        help="records of the static stream (--offline only)")
    parser.add_argument("--offline-passes", type=int, default=3,
                        help="incremental passes over the records after the static partition "
                             "(--offline only)")
    parser.add_argument("--shape", choices=list(SHAPES), default="segments",
                        help="the synthetic stream's shape: segments (26 fields, planted "
                             "communities), user_item (user, item and context fields, "
                             "power-law degrees, no communities), multi_hot (segments with "
                             "MLPerf's bags of 214 values a record) or user_history (user_item "
                             "with a history list of 20 items sharing the item table)")
    parser.add_argument("--numbering", choices=NUMBERINGS, default="hashed",
                        help="--offline: how ids are numbered: hashed (the decoder's 64-bit "
                             "feature hash) or dense (field by field, each field's values in "
                             "the order of their global popularity, as a preprocessed "
                             "Criteo-style dataset numbers them; the records shuffled)")
    parser.add_argument("--route-rounds", type=int, default=0,
                        help="batch-aware routing: rounds of moves after routing each global "
                             "batch (partitioner.batch_routing; 0: the trainer's default "
                             "routing alone)")
    parser.add_argument("--scale", action="store_true",
                        help="the scale curve instead (bench/partition_scale.py): full and "
                             "incremental seconds, peak memory and remote rows per sample for "
                             "windows of --scale-windows samples")
    parser.add_argument("--scale-windows", default="200000,1000000,4000000",
                        help="comma-separated window sizes of the scale curve (--scale only)")
    parser.add_argument("--scale-passes", type=int, default=3,
                        help="incremental passes per window, each after --period-records new "
                             "records (--scale only)")
    parser.add_argument("--strategy", default=None,
                        help="comma-separated strategies to run (default: every one of the "
                             f"protocol's: {', '.join(STRATEGIES[1:])}; --offline has no "
                             f"full); hash always runs, the baseline of 'vs hash'; offline, "
                             f"incremental brings static, its start. {PAPER}: HET-GMP's own "
                             "algorithm as its paper describes it (bench/hetgmp_paper.py)")
    parser.add_argument("--quick", action="store_true",
                        help="small CI-sized run: W=50k, P=25k, 4 periods, 4 and 8 workers "
                             "(--offline: 100k records; --sweep: 20k records, 2 shapes, one "
                             "generator and seed, 4 workers)")
    add_sweep_flags(parser)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv``, checked (a usage error exits 2 before anything runs)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # --offline runs both replica bases unless one is named.
    args.offline_bases = (REPLICA_BASES if args.replica_basis is None
                          else (args.replica_basis,))
    if (args.numbering != "hashed" or args.metis_seed is not None) and not args.offline:
        parser.error("--numbering and --metis-seed are variants of the --offline protocol")
    if args.scale and (args.offline or args.oracle):
        parser.error("--scale is a protocol of its own: not with --offline or --oracle")
    if args.sweep and (args.offline or args.oracle or args.scale):
        parser.error("--sweep is a protocol of its own: not with --offline, --oracle or --scale")
    if args.sweep:
        check_sweep_flags(parser, args)
    if args.scale and args.shape not in ("segments", "user_item"):
        parser.error("--scale runs the shapes of one value a field (segments, user_item)")
    args.replica_basis = args.replica_basis or PartitionConfig.replica_basis
    if args.quick:
        args.window, args.period_records, args.periods = 50_000, 25_000, 4
        args.records = min(args.records, 100_000)
        if args.scale:
            args.scale_windows, args.scale_passes = "50000,200000", 2
        if args.sweep:
            args.sweep_records, args.sweep_shapes = 20_000, "recipe,user_history"
            args.sweep_generators, args.sweep_seeds, args.sweep_workers = "0", "0", "4"
    if args.records < 1 or not 0 <= args.replica_fraction <= 1:
        parser.error("--records must be positive and --replica-fraction in [0, 1]")
    if args.offline_passes < 0 or args.route_rounds < 0:
        parser.error("--offline-passes and --route-rounds must be >= 0")
    if args.periods < 1 or args.window < 1 or args.period_records < 1:
        parser.error("--periods, --window and --period-records must be positive")
    try:
        args.scale_windows = [int(x) for x in str(args.scale_windows).split(",") if x.strip()]
    except ValueError:
        parser.error("--scale-windows takes comma-separated integers")
    if args.scale and (not args.scale_windows or min(args.scale_windows) < 1
                       or args.scale_passes < 0):
        parser.error("--scale-windows must be positive sizes and --scale-passes >= 0")
    args.worker_counts = [int(x) for x in str(args.workers).split(",") if x.strip()]
    args.strategies = _strategies(parser, args)
    return args


def _strategies(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The strategies ``--strategy`` names, in the protocol's order, hash first."""
    allowed = OFFLINE_STRATEGIES if args.offline else STRATEGIES
    if args.strategy is None:
        return list(allowed)
    if args.scale:
        parser.error("--strategy picks rows of the rolling and --offline protocols, not --scale")
    named = {x.strip() for x in str(args.strategy).split(",") if x.strip()}
    if not named or not named <= set(allowed):
        parser.error(f"--strategy takes comma-separated names among {', '.join(allowed)}")
    if args.offline and "incremental" in named:
        named.add("static")
    return [name for name in allowed if name == "hash" or name in named]


def _score(records: _Records, placement: Placement, global_batch: int,
           split_in_order: bool, seen: tuple[np.ndarray, np.ndarray] | None = None,
           rounds: int = 0) -> tuple[float, int, float, np.ndarray]:
    """Remote rows summed over the period, samples, the worst step sample imbalance, and the
    remote rows by what the window knew of their ids (with ``seen``, the window's sorted
    distinct ids and their sample counts): ``[unseen, seen once, seen more]``."""
    n = placement.num_workers
    total, worst = 0.0, 1.0
    classes = np.zeros(3, dtype=np.int64)
    for lo in range(0, len(records), global_batch):
        batch = records[lo:lo + global_batch]
        if split_in_order:
            workers = (np.arange(len(batch)) * n // len(batch)).astype(np.int32)
        elif rounds:
            workers = route_batch(batch.csr, placement, rounds=rounds)
        else:
            workers = route(batch.csr, placement)
        missing = remote_ids(batch.csr, workers, placement)
        total += float(sum(ids.size for ids in missing))
        worst = max(worst, imbalance(np.bincount(workers, minlength=n)))
        if seen is not None:
            classes += _seen_classes(np.concatenate(missing), *seen)
    return total, len(records), worst, classes


def _seen_classes(ids: np.ndarray, window_ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """How many of ``ids`` the window never saw, saw in one sample, saw in more."""
    pos = find_sorted(window_ids, ids)
    known = pos >= 0
    once = np.zeros(ids.size, dtype=bool)
    once[known] = counts[pos[known]] == 1
    return np.array([(~known).sum(), once.sum(), (known & ~once).sum()], dtype=np.int64)


def _oracle(window: WindowGraph, segments: np.ndarray, config: PartitionConfig) -> Placement:
    """The placement of a partitioner that knew each window sample's community (see docstring)."""
    n = config.num_workers
    sizes = np.bincount(segments)
    worker_of_segment = np.zeros(sizes.size, dtype=np.int64)
    load = np.zeros(n)
    for segment in np.argsort(-sizes, kind="stable"):
        worker_of_segment[segment] = int(np.argmin(load))
        load[worker_of_segment[segment]] += sizes[segment]
    cw = compact(window)
    owner = np.argmax(per_worker_counts(cw, worker_of_segment[segments], n), axis=1)
    return build_placement(cw, owner.astype(np.int32), None, config, version=1)


def _run_workers(n: int, ids: _Records, args: argparse.Namespace,
                 segments: np.ndarray | None = None) -> dict[str, _Track]:
    w, p = args.window, args.period_records
    config = PartitionConfig(num_workers=n, global_batch=args.global_batch, seed=args.seed,
                             replica_fraction=args.replica_fraction,
                             replica_basis=args.replica_basis,
                             route_rounds=args.route_rounds)
    makers: dict[str, Callable[[PartitionConfig], Partitioner]] = {
        "static": FullPartitioner, "full": FullPartitioner,
        "incremental": IncrementalPartitioner, PAPER: PaperPartitioner}
    names = tuple(args.strategies) + ((ORACLE,) if segments is not None else ())
    partitioners = {name: make(config) for name, make in makers.items() if name in names}
    current = {name: Placement.hash(n) for name in names}
    tracks = {name: _Track() for name in names}
    print(f"\n== {n} workers: window {w}, {args.periods} periods of {p} records, "
          f"global batch {args.global_batch} ==")
    header = f"{'period':>6} {'start':>8} | " + " | ".join(
        f"{name:>12} rr/s  red  imb  migrated   sec" for name in names)
    print(header)
    for t in range(args.periods):
        start = w + t * p
        window = ids[start - w:start].graph(start=start - w)
        records = ids[start:start + p]
        seen = np.unique(window.indices, return_counts=True)
        cells = []
        hash_rate = 0.0
        for name in names:
            old = current[name]
            seconds, migrated = 0.0, 0
            if name == ORACLE:
                assert segments is not None
                began = time.perf_counter()
                new = _oracle(window, segments[start - w:start], config).with_version(
                    old.version + 1)
                seconds = time.perf_counter() - began
                migrated = plan_diff(old, new, args.row_bytes).rows_moved
                current[name] = new
            elif name in partitioners and (t == 0 or name not in ONCE):
                reset_peak()
                began = time.perf_counter()
                new = partitioners[name].partition(window, None if t == 0 else old)
                seconds = time.perf_counter() - began
                peak = peak_mb()
                if peak is not None:
                    tracks[name].peak_mb.append(peak)
                report = getattr(partitioners[name], "last_pass", None)
                if report is not None:
                    counts = {"budget": report.budget, **report.moves_by_step()}
                    for key, n in counts.items():
                        tracks[name].pass_moves[key] = tracks[name].pass_moves.get(key, 0) + n
                migrated = plan_diff(old.with_version(new.version - 1), new,
                                     args.row_bytes).rows_moved
                current[name] = new
            placement = current[name]
            remote, samples, step_imb, classes = _score(
                records, placement, args.global_batch, split_in_order=(name == "hash"),
                seen=seen, rounds=args.route_rounds)
            rows_imb = row_imbalance(placement, window.indices) if name != "hash" else 1.0
            track = tracks[name]
            if t == 0:
                track.initial_rows, track.initial_seconds = migrated, seconds
            else:
                track.migrated.append(migrated)
                track.seconds.append(seconds)
            track.remote.append(remote)
            track.seen_classes += classes
            track.samples.append(samples)
            track.imbalance.append(max(step_imb, rows_imb))
            rate = remote / samples
            if name == "hash":
                hash_rate = rate
            red = 100.0 * (1.0 - rate / hash_rate) if hash_rate else 0.0
            cells.append(f"{name:>12} {rate:5.2f} {red:4.0f}% {max(step_imb, rows_imb):4.2f} "
                         f"{migrated:9d} {seconds:5.1f}")
        print(f"{t:>6} {start:>8} | " + " | ".join(cells), flush=True)
    return tracks


def _summary(n: int, tracks: dict[str, _Track], args: argparse.Namespace,
             drift_every: int) -> list[dict[str, object]]:
    w, p = args.window, args.period_records
    boundary = -(-w // drift_every) * drift_every
    after = [t for t in range(args.periods) if w + t * p >= boundary]
    rows = []
    hash_rate = sum(tracks["hash"].remote) / sum(tracks["hash"].samples)
    print(f"\n-- {n} workers, whole run ({len(after)} periods after drift) --")
    print(f"{'strategy':>12} {'rr/sample':>9} {'vs hash':>8} {'after drift':>11} "
          f"{'imbalance':>9} {'migrated':>9} {'seconds':>8} {'initial rows/sec':>17} "
          f"{'new ids':>7} {'once':>5}")
    for name in tracks:
        tr = tracks[name]
        rate = sum(tr.remote) / sum(tr.samples)
        after_rate: float | None = None  # null in the JSON when no period follows a drift
        if after:
            after_rate = sum(tr.remote[t] for t in after) / sum(tr.samples[t] for t in after)
        init_rows, init_sec = tr.initial_rows, tr.initial_seconds
        row = {
            "workers": n,
            "strategy": name,
            "remote_rows_per_sample": round(rate, 4),
            "remote_rows_per_sample_after_drift": (None if after_rate is None
                                                   else round(after_rate, 4)),
            "reduction_vs_hash": round(1.0 - rate / hash_rate, 4),
            "rows_migrated": int(sum(tr.migrated)),
            "repartition_seconds": round(sum(tr.seconds), 3),
            "imbalance": round(max(tr.imbalance), 4),
            "initial_rows_migrated": int(init_rows),
            "initial_seconds": round(init_sec, 3),
            # Seconds a repartition takes on average, and the process's peak memory during
            # any of them (the window and the records scored are resident throughout).
            "seconds": round(sum(tr.seconds) / max(len(tr.seconds), 1), 3),
            "peak_mem_mb": max(tr.peak_mb) if tr.peak_mb else None,
        }
        # What the window knew of the remote rows' ids: rows no placement built from it could
        # hold (ids it never saw), and ids it saw in a single sample.
        unseen, once = tr.seen_classes[:2] / max(int(tr.seen_classes.sum()), 1)
        row["remote_share_unseen_ids"] = round(float(unseen), 4)
        row["remote_share_ids_seen_once"] = round(float(once), 4)
        if tr.pass_moves:
            row["pass_moves"] = dict(tr.pass_moves)
        rows.append(row)
        after_text = "-" if after_rate is None else f"{after_rate:.3f}"
        print(f"{name:>12} {rate:9.3f} {100 * (1 - rate / hash_rate):7.1f}% {after_text:>11} "
              f"{row['imbalance']:9.3f} {row['rows_migrated']:9d} "
              f"{row['repartition_seconds']:8.1f} {init_rows:>9d}/{init_sec:5.1f}s "
              f"{100 * unseen:6.1f}% {100 * once:4.1f}%")
    for row in rows:
        moves = row.get("pass_moves")
        if isinstance(moves, dict):
            print(f"{row['strategy']:>12} row moves of its passes: regroup {moves['regroup']}, "
                  f"group balance {moves['group_balance']}, refine {moves['refine']} (budget "
                  f"{moves['budget']}); row balance {moves['row_balance']}, outside the budget")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; the last printed line is the JSON summary. Returns the exit code."""
    args = parse_args(argv)
    from hetgmp.streaming.synthetic import SyntheticConfig
    if args.sweep:
        return main_sweep(args)
    if args.scale:
        from bench.partition_scale import run as run_scale

        print(json.dumps({"bench": "partition", "protocol": "scale", "shape": args.shape,
                          "period_records": args.period_records,
                          "replica_fraction": args.replica_fraction,
                          "replica_basis": args.replica_basis, "rows": run_scale(args)}))
        return 0
    if args.offline:
        # Drift off: no record of the run comes after a drift event.
        static = SyntheticConfig(seed=args.seed, shape=args.shape, drift_every=args.records + 1)
        began = time.perf_counter()
        stream = SyntheticStream(static)
        block = stream.take(0, args.records)
        ids = _Records.of(stream, block)
        segments = _labels(stream, block) if args.oracle else None
        if args.numbering == "dense":
            ids, order = dense_records(stream, block, args.seed)
            segments = None if segments is None else segments[order]
        del block
        print(f"offline (HET-GMP's protocol), ids {args.numbering}: {args.records} records of "
              f"a static stream x "
              f"{ids.ids_per_record:.1f} ids in {time.perf_counter() - began:.1f} s, global batch "
              f"{args.global_batch}, replicas {args.replica_fraction:.1%} per worker, one full "
              f"partition then {args.offline_passes} incremental passes, scored on the records "
              f"they were computed from")
        from bench.partition_offline import run_offline

        offline = run_offline(ids, args, segments)
        for row in offline:
            row.update(shape=args.shape, protocol="offline", records=args.records,
                       route_rounds=args.route_rounds, numbering=args.numbering)
        summary: dict[str, object] = {
            "bench": "partition", "protocol": "offline", "shape": args.shape,
            "numbering": args.numbering, "records": args.records, "route_rounds": args.route_rounds,
            "replica_fraction": args.replica_fraction, "offline_passes": args.offline_passes,
            "rows": [r for r in offline if r["strategy"] != ORACLE]}
        if args.oracle:
            summary["ceiling"] = [r for r in offline if r["strategy"] == ORACLE]
        print(json.dumps(summary))
        return 0
    stream_config = SyntheticConfig(seed=args.seed, shape=args.shape)
    total = args.window + args.periods * args.period_records
    began = time.perf_counter()
    stream = SyntheticStream(stream_config)
    block = stream.take(0, total)
    ids = _Records.of(stream, block)
    segments = _labels(stream, block) if args.oracle else None
    del block
    print(f"generated {total} records x {ids.ids_per_record:.1f} ids in "
          f"{time.perf_counter() - began:.1f} s (drift every {stream_config.drift_every})")
    rows: list[dict[str, object]] = []
    for n in args.worker_counts:
        tracks = _run_workers(n, ids, args, segments)
        rows.extend(_summary(n, tracks, args, stream_config.drift_every))
    for row in rows:
        row.update(shape=args.shape, protocol="rolling", records=total,
                   route_rounds=args.route_rounds)
    summary = {"bench": "partition", "protocol": "rolling", "shape": args.shape,
               "route_rounds": args.route_rounds, "replica_fraction": args.replica_fraction,
               "replica_basis": args.replica_basis,
               "rows": [r for r in rows if r["strategy"] != ORACLE]}
    if args.oracle:
        summary["ceiling"] = [r for r in rows if r["strategy"] == ORACLE]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
