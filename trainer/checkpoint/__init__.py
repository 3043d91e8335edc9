"""Checkpoints: every rank's rows, the dense model, the placement and the Kafka offsets trained.

The manifest's schema and the checks a checkpoint passes before anything of it is loaded:
:mod:`trainer.checkpoint.manifest`; durable writes and verified reads:
:mod:`trainer.checkpoint.files`.
"""

from trainer.checkpoint.content import (
    load_dense,
    load_placement,
    load_rows,
    save_dense,
    save_placement,
    save_rows,
)
from trainer.checkpoint.files import CheckpointError, atomic_write
from trainer.checkpoint.manifest import (
    MANIFEST,
    Manifest,
    ModelLog,
    has_manifest,
    latest,
    new_step_dir,
    parse_manifest,
    prune,
    rank_file,
    read_manifest,
    set_aside_newer,
    step_dir,
    write_manifest,
)

__all__ = [
    "MANIFEST",
    "CheckpointError",
    "Manifest",
    "ModelLog",
    "atomic_write",
    "has_manifest",
    "latest",
    "load_dense",
    "load_placement",
    "load_rows",
    "new_step_dir",
    "parse_manifest",
    "prune",
    "rank_file",
    "read_manifest",
    "save_dense",
    "save_placement",
    "save_rows",
    "set_aside_newer",
    "step_dir",
    "write_manifest",
]
