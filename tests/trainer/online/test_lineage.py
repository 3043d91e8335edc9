"""The run count of a checkpoint directory: one lineage a directory, a run number each run; a
copy of the directory (``cp -a``) that trains is another job and takes a lineage of its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hetgmp.trainer.online.publisher import GENERATION_FILE, next_generation


def test_runs_of_one_directory_share_its_lineage_and_count_on(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    lineage, first = next_generation(str(root))
    assert first == 1
    assert next_generation(str(root)) == (lineage, 2)
    moved = tmp_path / "moved"
    root.rename(moved)  # the same directory under another name: still the same job
    assert next_generation(str(moved)) == (lineage, 3)


def test_a_copied_directory_publishes_as_a_job_of_its_own(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    lineage, _ = next_generation(str(root))
    copies = [tmp_path / f"copy-{i}" for i in range(3)]
    for c in copies:
        shutil.copytree(root, c, copy_function=shutil.copy2)  # as cp -a does
    forks = [next_generation(str(c)) for c in copies]
    assert len({f[0] for f in forks} | {lineage}) == 4  # every copy its own
    assert all(g == 2 for _, g in forks)
    # The original goes on as itself, and so does each copy from then on.
    assert next_generation(str(root)) == (lineage, 2)
    assert next_generation(str(copies[0])) == (forks[0][0], 3)


def test_a_directory_restored_in_place_stays_the_same_job(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    lineage, _ = next_generation(str(root))
    backup = tmp_path / "backup"
    shutil.copytree(root, backup, copy_function=shutil.copy2)
    shutil.rmtree(root)
    shutil.copytree(backup, root, copy_function=shutil.copy2)
    assert next_generation(str(root)) == (lineage, 2)


def test_a_run_count_written_before_directories_were_recorded_is_adopted(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / GENERATION_FILE).write_text(json.dumps({"lineage": "feed", "generation": 4}))
    assert next_generation(str(root)) == ("feed", 5)
    assert "directory" in json.loads((root / GENERATION_FILE).read_text())
