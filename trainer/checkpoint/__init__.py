"""Checkpoints: every rank's rows, the dense model, the placement and the Kafka offsets trained.

The manifest's schema and the checks a checkpoint passes before anything of it is loaded:
:mod:`trainer.checkpoint.manifest`; durable writes and verified reads:
:mod:`trainer.checkpoint.files`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import lazy_exports

if TYPE_CHECKING:
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

__getattr__ = lazy_exports(__name__, {
    "MANIFEST": "trainer.checkpoint.manifest",
    "CheckpointError": "trainer.checkpoint.files",
    "Manifest": "trainer.checkpoint.manifest",
    "ModelLog": "trainer.checkpoint.manifest",
    "atomic_write": "trainer.checkpoint.files",
    "has_manifest": "trainer.checkpoint.manifest",
    "latest": "trainer.checkpoint.manifest",
    "load_dense": "trainer.checkpoint.content",
    "load_placement": "trainer.checkpoint.content",
    "load_rows": "trainer.checkpoint.content",
    "new_step_dir": "trainer.checkpoint.manifest",
    "parse_manifest": "trainer.checkpoint.manifest",
    "prune": "trainer.checkpoint.manifest",
    "rank_file": "trainer.checkpoint.manifest",
    "read_manifest": "trainer.checkpoint.manifest",
    "save_dense": "trainer.checkpoint.content",
    "save_placement": "trainer.checkpoint.content",
    "save_rows": "trainer.checkpoint.content",
    "set_aside_newer": "trainer.checkpoint.manifest",
    "step_dir": "trainer.checkpoint.manifest",
    "write_manifest": "trainer.checkpoint.manifest",
})
