"""Checkpoints: every rank's rows, the dense model, the placement and the Kafka offsets trained.

The manifest's schema and the checks a checkpoint passes before anything of it is loaded:
:mod:`hetgmp.trainer.checkpoint.manifest`; durable writes and verified reads:
:mod:`hetgmp.trainer.checkpoint.files`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetgmp.runtime import lazy_exports

if TYPE_CHECKING:
    from hetgmp.trainer.checkpoint.content import (
        iter_rows,
        load_dense,
        load_placement,
        load_rows,
        save_dense,
        save_placement,
        save_rows,
    )
    from hetgmp.trainer.checkpoint.files import CheckpointError, atomic_write
    from hetgmp.trainer.checkpoint.manifest import (
        MANIFEST,
        Base,
        Manifest,
        ModelLog,
        chain,
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
    "Base",
    "CheckpointError",
    "Manifest",
    "ModelLog",
    "atomic_write",
    "chain",
    "has_manifest",
    "iter_rows",
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

__getattr__ = lazy_exports(__name__, {
    "MANIFEST": "hetgmp.trainer.checkpoint.manifest",
    "Base": "hetgmp.trainer.checkpoint.manifest",
    "CheckpointError": "hetgmp.trainer.checkpoint.files",
    "Manifest": "hetgmp.trainer.checkpoint.manifest",
    "ModelLog": "hetgmp.trainer.checkpoint.manifest",
    "atomic_write": "hetgmp.trainer.checkpoint.files",
    "chain": "hetgmp.trainer.checkpoint.manifest",
    "has_manifest": "hetgmp.trainer.checkpoint.manifest",
    "iter_rows": "hetgmp.trainer.checkpoint.content",
    "latest": "hetgmp.trainer.checkpoint.manifest",
    "load_dense": "hetgmp.trainer.checkpoint.content",
    "load_placement": "hetgmp.trainer.checkpoint.content",
    "load_rows": "hetgmp.trainer.checkpoint.content",
    "new_step_dir": "hetgmp.trainer.checkpoint.manifest",
    "parse_manifest": "hetgmp.trainer.checkpoint.manifest",
    "prune": "hetgmp.trainer.checkpoint.manifest",
    "rank_file": "hetgmp.trainer.checkpoint.manifest",
    "read_manifest": "hetgmp.trainer.checkpoint.manifest",
    "save_dense": "hetgmp.trainer.checkpoint.content",
    "save_placement": "hetgmp.trainer.checkpoint.content",
    "save_rows": "hetgmp.trainer.checkpoint.content",
    "set_aside_newer": "hetgmp.trainer.checkpoint.manifest",
    "step_dir": "hetgmp.trainer.checkpoint.manifest",
    "write_manifest": "hetgmp.trainer.checkpoint.manifest",
})
