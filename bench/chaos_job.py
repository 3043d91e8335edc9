"""The job the chaos benchmark supervises: ``python -m bench.chaos_job CONFIG.json``.

Two (or ``workers``) CPU ranks train online from the chaos topic with checkpoints, every rank
keeping a ledger of what it trained (:class:`hetgmp.trainer.testing.Ledgered`) and watching the fault
file the driver arms (:class:`hetgmp.trainer.testing.FaultFile`): both observers of the run. It exits
0 when the topic stays idle, 1 when a rank failed (the supervisor then starts it again with
``resume``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hetgmp.runtime import setup_logging
from hetgmp.streaming import ConsumerConfig, KafkaSettings
from hetgmp.trainer.dist import LaunchConfig, WorkerFailed, launch, stop_event
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, run_rank
from hetgmp.trainer.sources import KafkaSpec
from hetgmp.trainer.step import TrainConfig
from hetgmp.trainer.testing import FaultFile, Ledgered


def job_of(c: dict) -> Job:
    """The job a config describes (the driver writes the config)."""
    spec = KafkaSpec(KafkaSettings(bootstrap_servers=c["bootstrap"], client_id="chaos"),
                     ConsumerConfig(topic=c["topic"], group_id=c["group"]),
                     idle_s=c["idle_s"], poll_s=0.05)
    online = OnlineConfig(repartition_interval=str(c["repartition_interval"]),
                          window=c["window"], migration_chunk_bytes=c["chunk_bytes"],
                          checkpoint_dir=c["checkpoint_dir"],
                          checkpoint_interval=str(c["checkpoint_interval"]),
                          keep_checkpoints=2, resume=c["resume"])
    return Job(spec, ModelConfig(embed_dim=8, hidden=(32, 16), seed=c["seed"]),
               train=TrainConfig(global_batch=c["global_batch"], warmup=c["warmup"],
                                 log_every=0),
               online=online, seed=c["seed"],
               # One ledger directory a run: the replay of a resume is what its ranks trained
               # that an earlier run's had.
               observers=(Ledgered(str(Path(c["ledger"]) / f"run-{c['run']:03d}")),
                          FaultFile(c["fault_file"])))


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    setup_logging("WARNING")
    try:
        launch(run_rank, job_of(config), LaunchConfig(workers=config["workers"], device="cpu",
                                                      timeout_s=config["timeout_s"]),
               stop_event())
    except WorkerFailed as exc:
        print(f"chaos job: rank {exc.rank} failed: {exc.summary}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
