"""``hetgmp bench chaos``: faults against a job that trains online, and a ledger that proves
nothing was lost.

A drifting click stream is produced into the embedded broker at a steady rate while a job of
CPU ranks (``bench.chaos_job``) trains online from it with checkpoints. A seeded schedule
applies faults, one at a time:

* ``kill_step``: SIGKILL of a random rank, at a random moment of training;
* ``kill_migration`` / ``kill_checkpoint``: a random rank SIGKILLs itself after the first chunk
  of the next migration, or while writing the next checkpoint (armed through the job's fault
  file: such moments are too short to hit from outside);
* ``stop_broker``: SIGSTOP of the broker for tens of seconds, then SIGCONT;
* ``kill_partitioner``: SIGKILL of rank 0's partitioner process;
* ``disk_full``: the checkpoint directory (a small tmpfs, where this user may mount one) is
  filled until a checkpoint fails, then emptied.

After each fault a supervisor loop (as systemd or Kubernetes would) starts the job again with
``resume`` whenever it died. Every rank keeps a ledger of the (partition, offset) of every
record it trained (``trainer.testing.Ledger``). At the end the topic is read back whole and the
ledger proves: no offset skipped; each restart replayed at most one checkpoint interval plus one
global batch; the final checkpoint counts exactly the records the ledger holds. Everything runs
on loopback. Last line: a JSON summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.chaos_ledger import LedgerWatch, account, topic_offsets
from hetgmp.runtime import free_port
from hetgmp.streaming import EmbeddedBroker, KafkaSettings, ProduceConfig, SyntheticConfig, produce
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.testing import FaultFile

__all__ = ["KINDS", "build_parser", "main", "parse_args"]

KINDS = ("kill_step", "kill_migration", "kill_checkpoint", "stop_broker", "kill_partitioner",
         "disk_full")
PER_MESSAGE = 16
_RECOVERY_LIMIT_S = 150.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hetgmp bench chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", type=int, default=20, help="faults to apply")
    p.add_argument("--seed", type=int, default=0, help="seed of the schedule and the stream")
    p.add_argument("--kinds", default=",".join(KINDS), help="fault kinds to draw from")
    p.add_argument("--rate", type=float, default=4000.0, help="records produced per second")
    p.add_argument("--workers", type=int, default=2, help="ranks of the job")
    p.add_argument("--global-batch", type=int, default=2048, help="samples per step")
    p.add_argument("--checkpoint-interval", type=int, default=20_000,
                   help="records between checkpoints")
    p.add_argument("--repartition-interval", type=int, default=15_000,
                   help="records between repartitions")
    p.add_argument("--stop-s", default="15,30", help="seconds the broker stays stopped: lo,hi")
    p.add_argument("--max-seconds", type=float, default=1200.0,
                   help="stop applying faults after this long (the run then finishes)")
    p.add_argument("--workdir", default="", help="where the run's files go (default: a temp dir)")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds or args.faults < 0 or args.workers < 2 or args.rate <= 0:
        build_parser().error(f"--kinds from {','.join(KINDS)} (got {bad or 'none'}), "
                             f"--faults >= 0, --workers >= 2, --rate > 0")
    args.kinds = kinds
    return args


@dataclass
class FaultRecord:
    """One fault and how the job came back from it."""

    index: int
    kind: str
    at_s: float
    ended_run: bool = False
    recovered: bool = False
    recovery_s: float | None = None
    note: str = ""


class Supervised:
    """The job process, started again with ``resume`` whenever it dies."""

    def __init__(self, config: dict, workdir: Path) -> None:
        self.config, self.workdir = config, workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.started_ms = 0.0

    def start(self) -> None:
        self.config["resume"] = self.runs > 0
        self.config["run"] = self.runs
        path = self.workdir / f"job-{self.runs}.json"
        path.write_text(json.dumps(self.config))
        self.started_ms = time.time() * 1000
        with (self.workdir / f"job-{self.runs}.log").open("wb") as log:  # the child has it
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.chaos_job", str(path)],
                                         stdout=log, stderr=subprocess.STDOUT, cwd=_ROOT)
        self.runs += 1

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def rank_pids(self) -> dict[int, int]:
        """Pids of the current run's ranks (their ledgers are named after them)."""
        run = Path(self.config["ledger"]) / f"run-{self.runs - 1:03d}"
        out = {}
        for f in run.glob("rank-*.i64"):
            _, rank, _, pid = f.stem.split("-")
            out[int(rank)] = int(pid)
        return out


_ROOT = str(Path(__file__).resolve().parents[1])


def _children(pid: int) -> list[int]:
    """Pids of the processes whose parent is ``pid`` (from /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@contextlib.contextmanager
def _small_disk(path: Path, mb: int) -> Iterator[Path | None]:
    """A tmpfs of ``mb`` MB mounted at ``path`` (None when this user may not mount one)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


class Chaos:
    """One run of the benchmark (see the module docstring)."""

    def __init__(self, args: argparse.Namespace, workdir: Path, disk: Path | None,
                 broker: EmbeddedBroker) -> None:
        self.args, self.workdir, self.disk, self.broker = args, workdir, disk, broker
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="chaos")
        self.topic = "chaos"
        ledger = workdir / "ledger"
        self.fault_file = FaultFile(str(workdir / "FAULT"))
        self.job = Supervised({
            "bootstrap": broker.bootstrap_servers, "topic": self.topic, "group": "chaos-train",
            # Longer than any broker stop: a stalled broker delivers nothing, which a shorter
            # idle time would take for the end of the topic (a clean exit, then a resume).
            "idle_s": max(float(args.stop_s.split(",")[1]) + 15.0, 20.0),
            "repartition_interval": args.repartition_interval,
            "window": 60_000, "chunk_bytes": 16 << 10,
            "checkpoint_dir": str(disk or workdir / "checkpoints"),
            "checkpoint_interval": args.checkpoint_interval, "seed": args.seed,
            "global_batch": args.global_batch, "warmup": 10_000, "workers": args.workers,
            "timeout_s": 60.0, "ledger": str(ledger), "fault_file": str(self.fault_file.path),
            "resume": False}, workdir)
        self.watch = LedgerWatch(ledger)
        self.records: list[FaultRecord] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- the schedule ------------------------------------------------------------------------

    def run(self) -> dict:
        kinds = list(self.args.kinds)
        if self.disk is None and "disk_full" in kinds:
            kinds.remove("disk_full")
            print("disk_full skipped: this user may not mount a tmpfs", flush=True)
        stop_producing = threading.Event()
        produced: dict = {}
        producer = threading.Thread(target=self._produce, args=(stop_producing, produced),
                                    daemon=True)
        producer.start()
        self.job.start()
        try:
            for i in range(self.args.faults):
                if self.now() > self.args.max_seconds:
                    print(f"--max-seconds reached after {i} faults", flush=True)
                    break
                self._await_training(self.job.started_ms)
                time.sleep(self.rng.uniform(2.0, 6.0))
                if i % len(kinds) == 0:  # every kind once a round, in a seeded order
                    order = kinds if i == 0 else self.rng.sample(kinds, len(kinds))
                kind = order[i % len(kinds)]
                record = FaultRecord(i + 1, kind, round(self.now(), 1))
                runs = self.job.runs
                fault_ms = self._apply(record)
                self._recover(record, fault_ms)
                record.ended_run = self.job.runs > runs
                self.records.append(record)
                print(f"fault {record.index:>2} {record.kind:<17} at {record.at_s:7.1f} s: "
                      f"{'recovered' if record.recovered else 'NOT recovered'}"
                      f"{'' if record.recovery_s is None else f' in {record.recovery_s:.1f} s'}"
                      f"{' (job restarted)' if record.ended_run else ''}"
                      f"{' - ' + record.note if record.note else ''}", flush=True)
        finally:
            stop_producing.set()
            producer.join(300)
        return self._finish(produced)

    def _produce(self, stop: threading.Event, out: dict) -> None:
        try:
            out["report"] = produce(
                self.kafka, ProduceConfig(topic=self.topic, count=0, rate=self.args.rate,
                                          partitions=4, records_per_message=PER_MESSAGE),
                SyntheticConfig(seed=self.args.seed, drift_every=60_000), stop=stop)
        except Exception as exc:  # reported in the summary: the ledger is checked anyway
            out["error"] = f"{type(exc).__name__}: {exc}"

    def _await_training(self, since_ms: float, limit: float = _RECOVERY_LIMIT_S) -> float | None:
        """Wait until a step is trained after ``since_ms`` (starting the job again whenever it
        dies); the time of that step, or None past ``limit`` seconds."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if not self.job.alive:
                self.job.start()
            latest = self.watch.latest_ms()
            if latest > since_ms:
                return latest
            time.sleep(0.2)
        return None

    # -- the faults --------------------------------------------------------------------------

    def _apply(self, r: FaultRecord) -> float:
        """Apply one fault; the wall time (ms) recovery is measured from."""
        pids = self.job.rank_pids()
        rank = self.rng.randrange(self.args.workers)
        if r.kind == "kill_step":
            os.kill(pids[rank], signal.SIGKILL)
            r.note = f"rank {rank}"
        elif r.kind in ("kill_migration", "kill_checkpoint"):
            at = r.kind.removeprefix("kill_")
            self.fault_file.arm(rank, at)
            r.note = f"rank {rank}, armed for the next {at}"
            if self.job.wait(90.0) is None:  # no such moment came
                with contextlib.suppress(FileNotFoundError):
                    Path(self.fault_file.path).unlink()
                r.note += "; none came within 90 s"
        elif r.kind == "stop_broker":
            pause = self.rng.uniform(*(float(x) for x in self.args.stop_s.split(",")))
            assert self.broker.pid is not None
            os.kill(self.broker.pid, signal.SIGSTOP)
            time.sleep(pause)
            os.kill(self.broker.pid, signal.SIGCONT)
            r.note = f"{pause:.0f} s"
        elif r.kind == "kill_partitioner":
            kids = [k for k in _children(pids[0]) if "spawn_main" in _cmdline(k)
                    and "resource_tracker" not in _cmdline(k)]
            for k in kids:
                os.kill(k, signal.SIGKILL)
            r.note = f"{len(kids)} process(es)"
            self.job.wait(60.0)  # rank 0 fails at the next placement it asks for
        elif r.kind == "disk_full":
            assert self.disk is not None
            filler = self.disk / "filler"
            with contextlib.suppress(OSError), filler.open("wb") as f:
                while True:
                    f.write(b"\0" * (1 << 20))
            code = self.job.wait(90.0)
            filler.unlink()
            r.note = "a checkpoint failed" if code is not None else "no checkpoint came"
        return time.time() * 1000

    def _recover(self, r: FaultRecord, fault_ms: float) -> None:
        back = self._await_training(fault_ms)
        r.recovered = back is not None
        r.recovery_s = None if back is None else round((back - fault_ms) / 1000, 1)

    # -- the end -----------------------------------------------------------------------------

    def _finish(self, produced: dict) -> dict:
        # The topic is complete: the job trains to its end and stops when it stays idle.
        if not self.job.alive:
            self.job.start()
        code = self.job.wait(600.0)
        if code != 0:  # one more resume: the last fault may have ended the last run
            self.job.start()
            code = self.job.wait(600.0)
        ends = topic_offsets(self.kafka, self.topic)
        final = ckpt.latest(self.job.config["checkpoint_dir"])
        acct = account(self.watch.directory, ends, PER_MESSAGE)
        report = produced.get("report")
        return {
            "bench": "chaos", "faults": len(self.records),
            "recovered": sum(r.recovered for r in self.records),
            "skipped_offsets": acct.skipped, "max_replay_records": acct.max_replay,
            "checkpoint_interval_records": self.args.checkpoint_interval,
            "global_batch": self.args.global_batch,
            "max_recovery_s": max((r.recovery_s or 0.0 for r in self.records), default=0.0),
            "final_records": final.records if final is not None else None,
            "ledger_records": acct.distinct, "topic_records": acct.expected,
            "produced_records": report.records if report is not None else None,
            "producer_error": produced.get("error"), "job_runs": self.job.runs,
            "last_exit": code, "kinds": sorted({r.kind for r in self.records}),
            "table": [asdict(r) for r in self.records],
        }


def _print(summary: dict) -> None:
    print("\nfault  kind               at (s)  recovered  seconds  restart  note")
    for r in summary["table"]:
        print(f"{r['index']:>5}  {r['kind']:<17} {r['at_s']:>7.1f}  "
              f"{'yes' if r['recovered'] else 'NO':>9}  "
              f"{'' if r['recovery_s'] is None else format(r['recovery_s'], '.1f'):>7}  "
              f"{'yes' if r['ended_run'] else 'no':>7}  {r['note']}")
    bound = summary["checkpoint_interval_records"] + summary["global_batch"]
    print(f"\nrecovered {summary['recovered']} of {summary['faults']} faults (max "
          f"{summary['max_recovery_s']:.1f} s); skipped offsets {summary['skipped_offsets']}; "
          f"max replay {summary['max_replay_records']:,} records (bound {bound:,}); final "
          f"checkpoint {summary['final_records']:,} records, ledger {summary['ledger_records']:,}"
          f", topic {summary['topic_records']:,}; {summary['job_runs']} job runs")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        workdir = Path(args.workdir) if args.workdir else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="hetgmp-chaos-")))
        workdir.mkdir(parents=True, exist_ok=True)
        disk = stack.enter_context(_small_disk(workdir / "disk", 96)) \
            if "disk_full" in args.kinds else None
        broker = stack.enter_context(EmbeddedBroker(port=free_port()))
        chaos = Chaos(args, workdir, disk, broker)
        stack.callback(chaos.job.stop)
        summary = chaos.run()
    _print(summary)
    summary.pop("table")
    print(json.dumps(summary), flush=True)
    bound = summary["checkpoint_interval_records"] + summary["global_batch"]
    ok = (summary["recovered"] == summary["faults"] and summary["skipped_offsets"] == 0
          and summary["max_replay_records"] <= bound
          and summary["final_records"] == summary["ledger_records"] == summary["topic_records"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
