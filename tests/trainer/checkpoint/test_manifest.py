"""A checkpoint's manifest is checked against its schema and its directory before anything of it
is loaded; a diverged run stops before it checkpoints."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from exact_jobs import EXACT, SYN

from hetgmp.partitioner import Placement
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.dist import LocalComm, run_threads
from hetgmp.trainer.online import Diverged, OnlineConfig
from hetgmp.trainer.run import Job, run_rank
from hetgmp.trainer.sources import SyntheticSpec

BATCH = 240
SOURCE = SyntheticSpec(SYN, 0, BATCH * 6)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint of a 2-rank job (ranks as threads)."""
    root = tmp_path_factory.mktemp("good")
    job = Job(SOURCE, **EXACT, placement=Placement.hash(2),
              online=OnlineConfig(repartition_interval="0", checkpoint_dir=str(root)))
    run_threads(run_rank, job, 2)
    found = ckpt.latest(root)
    assert found is not None and found.world == 2
    return found.path


@pytest.fixture()
def copy(written: Path, tmp_path: Path) -> Path:
    target = tmp_path / written.name
    shutil.copytree(written, target)
    return target


def _edit(directory: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = directory / ckpt.MANIFEST
    body = json.loads(path.read_text())
    change(body)
    path.write_text(json.dumps(body))


MODEL = {"topic": "clicks.model", "lineage": "ab12", "generation": 2, "publishes": 40, "offsets": {"0": 7},
         "final": False}


def test_an_untouched_checkpoint_passes(copy: Path) -> None:
    m = ckpt.read_manifest(copy, verify=True)
    assert m.world == 2 and set(m.files) == {"rank-00000.npz", "rank-00001.npz", "dense.npz",
                                             "placement.npz"}
    assert m.model is None  # a synthetic source publishes no delta log


def test_the_delta_log_position_reads_back(copy: Path) -> None:
    _edit(copy, lambda b: b.update(model=MODEL))
    m = ckpt.read_manifest(copy)
    assert m.model == ckpt.ModelLog("clicks.model", "ab12", 2, 40, {0: 7}, False)
    assert m.model.body() == MODEL


@pytest.mark.parametrize("change,message", [
    (lambda b: b["files"].update({"../../etc/hostname": {"bytes": 1, "sha256": "0" * 64}}),
     "files must name exactly"),
    (lambda b: b["files"].pop("rank-00001.npz"), "files must name exactly"),
    (lambda b: b.update(files=5), "files must name exactly"),
    (lambda b: b["files"]["dense.npz"].update(sha256="zz"), "64 hex digits"),
    (lambda b: b.update(step=-3), "step must be an integer >= 0"),
    (lambda b: b.update(world="2"), "world must be an integer"),
    (lambda b: b["offsets"].update({"x": 4}), "offsets must map partition numbers"),
    (lambda b: b.update(surprise=1), "unknown keys"),
    (lambda b: b.pop("records"), "missing keys"),
    (lambda b: b.update(format="other/9"), "unknown format"),
    (lambda b: b.update(model={**MODEL, "offsets": {"0": -1}}), "model.offsets must map"),
    (lambda b: b.update(model={**MODEL, "final": 1}), "model.final must be true or false"),
    (lambda b: b.update(model={**MODEL, "publishes": "9"}), "publishes must be an integer"),
    (lambda b: b.update(model={**MODEL, "topic": ""}), "model.topic must be a topic name"),
    (lambda b: b.update(model={"topic": "t"}), "model must be an object of exactly"),
], ids=["path-outside", "rank-dropped", "files-not-a-map", "bad-digest-text", "negative-step",
        "world-a-string", "bad-partition", "unknown-key", "missing-key", "format",
        "model-offset", "model-final", "model-publishes", "model-topic", "model-keys"])
def test_a_manifest_against_its_schema_is_refused_with_the_reason(copy: Path, change,
                                                                  message: str) -> None:
    _edit(copy, change)
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.read_manifest(copy)


def test_a_world_edited_down_is_caught_by_the_rank_file_it_no_longer_names(copy: Path) -> None:
    def shrink(b: dict[str, Any]) -> None:
        b["world"] = 1
        b["files"].pop("rank-00001.npz")

    _edit(copy, shrink)
    with pytest.raises(ckpt.CheckpointError, match="does not name.*rank-00001.npz"):
        ckpt.read_manifest(copy)


def test_a_rank_file_replaced_by_a_link_is_refused(copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.npz"
    shutil.copy(copy / "rank-00000.npz", outside)
    (copy / "rank-00000.npz").unlink()
    os.symlink(outside, copy / "rank-00000.npz")
    with pytest.raises(ckpt.CheckpointError, match="not a regular file"):
        ckpt.read_manifest(copy)


def test_a_rank_file_swapped_for_another_of_the_same_size_fails_its_digest_at_load(
        copy: Path) -> None:
    path = copy / "rank-00001.npz"
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF
    path.write_bytes(bytes(data))
    manifest = ckpt.read_manifest(copy)  # sizes agree: only the digest tells
    with pytest.raises(ckpt.CheckpointError, match="does not match its digest"):
        ckpt.load_rows(manifest)
    assert ckpt.latest(copy.parent) is None  # and --resume does not take it


def test_a_placement_of_another_world_is_refused(copy: Path) -> None:
    path = copy / "placement.npz"
    with np.load(path) as a:
        arrays = {k: a[k] for k in a.files}
    arrays["num_workers"] = np.array([3])
    np.savez(path, **arrays)

    def resign(b: dict[str, Any]) -> None:
        data = path.read_bytes()
        import hashlib

        b["files"]["placement.npz"] = {"bytes": len(data), "sha256": hashlib.sha256(data)
                                       .hexdigest()}

    _edit(copy, resign)
    with pytest.raises(ckpt.CheckpointError, match="placement is for 3 ranks"):
        ckpt.load_placement(ckpt.read_manifest(copy, verify=True))


@pytest.mark.parametrize("after", [30, 2])
def test_a_run_whose_loss_turns_nan_stops_before_it_checkpoints(tmp_path: Path,
                                                                after: int) -> None:
    # A step reads each loss a step late; with a checkpoint due right after the first NaN
    # loss (step 2's: the first update makes the parameters infinite), the loop reads that
    # loss before it writes.
    train = replace(EXACT["train"], dense_optimizer="sgd", dense_lr=1e300)  # diverges at once
    job = Job(SyntheticSpec(SYN, 0, BATCH * 40), EXACT["model"], EXACT["store"], train,
              placement=Placement.hash(1),
              online=OnlineConfig(repartition_interval="0", checkpoint_dir=str(tmp_path),
                                  checkpoint_interval=str(BATCH * after)))
    with pytest.raises(Diverged, match="NaN or infinite"):
        run_rank(LocalComm(), job)
    assert ckpt.latest(tmp_path) is None  # nothing saved, nothing committed


def test_resuming_removes_what_a_crash_left_half_written_and_keeps_damage_to_look_at(
        copy: Path) -> None:
    """A job that crashes while checkpointing, again and again, used to keep every half-written
    directory as damaged-*, until its disk was full (the chaos benchmark's tmpfs was)."""
    root = copy.parent
    kept = ckpt.read_manifest(copy)
    half = ckpt.step_dir(root, kept.step + 5)  # rows written, no manifest: a crash
    shutil.copytree(copy, half)
    (half / ckpt.MANIFEST).unlink()
    damaged = ckpt.step_dir(root, kept.step + 9)  # complete, then damaged
    shutil.copytree(copy, damaged)
    (damaged / "dense.npz").write_bytes(b"not what was written")
    moved = ckpt.set_aside_newer(root, kept)
    assert not half.exists() and moved == [root / f"damaged-{damaged.name}"]
    assert moved[0].is_dir() and copy.is_dir()
