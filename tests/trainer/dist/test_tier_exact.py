"""The disk tier changes nothing a model learns (issue 57): with each rank's memory tier far
smaller than its share of the table, s = 0 training on 2 thread ranks equals one process without
a tier (float64), through live migrations, a full checkpoint and its increments, and a resume on
another number of ranks from the last increment.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from exact_jobs import BATCH, EXACT, SYN, WINDOW

from hetgmp.partitioner import Placement
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.streaming import SyntheticStream
from hetgmp.trainer.dist import LocalComm, run_threads
from hetgmp.trainer.online import checkpointer
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, graph_placement, run_rank
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.testing import AuditRun, ReturnState, StoreTiers

pytestmark = pytest.mark.slow  # 3 s: the fast lane's budget; make test and make stress run it

STEPS = 20
SOURCE = SyntheticSpec(SYN, start=WINDOW.records, records=BATCH * STEPS)
MEMORY_ROWS = 300  # a rank owns thousands of rows here


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(1)
    return run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=Placement.hash(1),
                                     observers=(ReturnState,)))


def _job(disk: Path, placement: Placement, **kw: object) -> Job:
    store = replace(EXACT["store"], max_rows=MEMORY_ROWS, disk_dir=str(disk), prefetch=True)
    return Job(SOURCE, EXACT["model"], store, EXACT["train"], placement=placement,
               observers=(ReturnState, StoreTiers, AuditRun), **kw)  # type: ignore[arg-type]


def test_spilled_rows_train_exactly_through_migrations_and_a_resume_on_one_rank(
        tmp_path: Path, reference, max_diff, monkeypatch: pytest.MonkeyPatch) -> None:
    # Full checkpoints write (and the resume reads) the disk rows 200 a file.
    monkeypatch.setattr(checkpointer, "PART_ROWS", 200)
    world = 2
    ids = np.unique(SyntheticStream(SYN).feature_ids(0, WINDOW.records + BATCH * STEPS))
    rng = np.random.default_rng(5)
    owners = rng.integers(0, world, ids.size)
    reps = tuple(np.sort(rng.choice(ids[owners != w], 100, replace=False)) for w in range(world))
    graph = graph_placement(SyntheticStream(SYN).feature_ids(WINDOW.start, WINDOW.records),
                            world, EXACT["train"])
    schedule = ((3, graph.with_version(1)), (8, Placement(2, world, ids, owners, reps)),
                (14, Placement.hash(world, 3)))
    online = OnlineConfig(repartition_interval="0", drift_threshold=0.0,
                          migration_chunk_bytes=96 * 3000)
    ranks = run_threads(run_rank, _job(tmp_path / "a", Placement.hash(world), online=online,
                                       schedule=schedule), world)
    dense, emb = max_diff(reference, ranks)
    assert dense <= 1e-9 and emb <= 1e-9, (dense, emb)
    done = [e for e in ranks[0].online["events"] if e["event"] == "migration_done"]
    assert [e["version"] for e in done] == [1, 2, 3]
    for r in ranks:  # the tier did the work: most rows on disk, many read back
        s = r.observed["store"]
        assert s["disk_rows"] > 3 * MEMORY_ROWS and s["restored"] > 1000, s
        assert s["spilled"] > 1000 and s["evicted"] == 0, s
        assert s["read_ahead"] > 100, s  # the next batch's spilled rows were read ahead

    # Half the run on two ranks, through two migrations and checkpoints every other step
    # (one full, then increments); the rest on one rank from the last increment: the same model.
    root = tmp_path / "ckpt"
    half = replace(online, checkpoint_dir=str(root), max_records=BATCH * STEPS // 2,
                   checkpoint_interval=str(2 * BATCH))
    first = run_threads(run_rank, _job(tmp_path / "b", Placement.hash(world), online=half,
                                       schedule=schedule[:2]), world)
    assert first[0].steps == STEPS // 2
    last = ckpt.latest(root)
    assert last is not None and last.step == STEPS // 2 and last.depth == 4, last
    sizes = [sum(f["bytes"] for n, f in m.files.items() if n.startswith("rank-"))
             for m in ckpt.chain(last)]
    assert len(ckpt.chain(last)[0].rank_files(0)) > 3  # the full one, in parts
    per_row = sizes[0] / len(ckpt.load_rows(ckpt.chain(last)[0])[0])
    table = len(ckpt.load_rows(last)[0])
    assert sizes[-1] < 0.8 * table * per_row, (sizes, table)  # the rows changed, not all
    resume = replace(online, checkpoint_dir=str(root), resume=True)
    torch.set_num_threads(1)
    one = run_rank(LocalComm(), _job(tmp_path / "c", Placement.hash(1), online=resume))
    assert one.resumed_from == STEPS // 2 and one.steps == STEPS
    assert one.observed["store"]["disk_rows"] > 3 * MEMORY_ROWS
    dense, emb = max_diff(reference, [one])
    assert dense <= 1e-9 and emb <= 1e-9, (dense, emb)
    # Every tier removed its files when its rank ended (checkpoints hold the rows).
    for d in ("a", "b", "c"):
        assert not list((tmp_path / d).glob("tier-*")), d
