"""``hetgmp serve``: answer predictions from the freshest rows the trainer published.

Loads the newest complete checkpoint of ``--checkpoint-dir`` (waiting for one if there is none
yet), follows the model delta log from the offsets that checkpoint covers, and serves
``/predict``, ``/healthz``, ``/readyz`` and ``/metrics`` (:mod:`trainer.serving.server`).
Several serve processes can follow one log. SIGINT/SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from typing import Any

from streaming import KafkaSettings, Schema
from streaming.runtime import add_flags
from trainer.app.commands import settings
from trainer.types import ServeConfig

__all__ = ["add_serve_flags", "run_serve"]

log = logging.getLogger("hetgmp.serve")


def add_serve_flags(parser: argparse.ArgumentParser, toml: dict[str, Any]) -> None:
    """The flags of ``hetgmp serve``."""
    add_flags(parser.add_argument_group("serve", "the model and the HTTP server"), ServeConfig,
              "serve", toml=toml)
    add_flags(parser.add_argument_group("kafka", "how to reach the cluster (the delta log)"),
              KafkaSettings, "kafka", toml=toml)


def _wait_for_checkpoint(root: str, wait_s: float) -> Any:
    from trainer import checkpoint as ckpt

    deadline = time.monotonic() + wait_s if wait_s > 0 else float("inf")
    said = False
    while True:
        found = ckpt.latest(root)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            return None
        if not said:
            log.info("no complete checkpoint in %s yet: waiting for the trainer's first", root)
            said = True
        time.sleep(1.0)


def run_serve(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM; 0 stopped, 1 failed, 2 refused settings."""
    import torch

    from trainer import checkpoint as ckpt
    from trainer.serving import Follower, FollowerThread, Service, ServingModel, load_signer

    cfg = settings(ServeConfig, args)
    kafka = settings(KafkaSettings, args)
    if not cfg.checkpoint_dir:
        print("hetgmp serve: error: --checkpoint-dir is required (the training job's)",
              file=sys.stderr)
        return 2
    try:
        schema = Schema.parse(cfg.schema)
    except ValueError as exc:
        print(f"hetgmp serve: error: --schema: {exc}", file=sys.stderr)
        return 2
    try:
        signer = load_signer(cfg.delta_key_file)
    except ValueError as exc:
        print(f"hetgmp serve: error: --delta-key-file: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    manifest = _wait_for_checkpoint(cfg.checkpoint_dir, cfg.wait_s)
    if manifest is None:
        print(f"hetgmp serve: error: no complete checkpoint in {cfg.checkpoint_dir} after "
              f"{cfg.wait_s:g} s", file=sys.stderr)
        return 1
    try:
        model = ServingModel.from_checkpoint(manifest)
    except ckpt.CheckpointError as exc:
        print(f"hetgmp serve: error: {exc}", file=sys.stderr)
        return 1
    if (len(schema.sparse), len(schema.dense)) != (model.fields, model.n_dense):
        print(f"hetgmp serve: error: --schema has {len(schema.sparse)} sparse and "
              f"{len(schema.dense)} dense fields; the model was trained on {model.fields} and "
              f"{model.n_dense}", file=sys.stderr)
        return 2
    log.info("loaded %s (step %d): %d rows", manifest.path, manifest.step, len(model.table))
    thread = None
    if cfg.follow:
        assert manifest.model is not None  # from_checkpoint refuses a checkpoint without one
        topic = cfg.model_topic or manifest.model.topic
        follower = Follower(kafka, topic, model, manifest.model.offsets, signer=signer)
        thread = FollowerThread(follower)
        thread.start()
        log.info("following %s from offsets %s", topic, manifest.model.offsets)
    service = Service(model, thread, schema, cfg.format, cfg.max_record_bytes, cfg.max_records,
                      cfg.threads)
    try:
        return asyncio.run(_serve(service, cfg))
    finally:
        if thread is not None:
            thread.stop()
        service.pool.shutdown(wait=False)


async def _serve(service: Any, cfg: ServeConfig) -> int:
    from aiohttp import web

    from trainer.serving import build_app

    runner = web.AppRunner(build_app(service, cfg.max_body_bytes), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port)
    try:
        await site.start()
    except OSError as exc:
        print(f"hetgmp serve: error: cannot listen on {cfg.host}:{cfg.port}: {exc}",
              file=sys.stderr)
        await runner.cleanup()
        return 1
    port = runner.addresses[0][1] if runner.addresses else cfg.port
    # One line a supervisor (or a test) can wait for.
    print(f"hetgmp serve: listening on http://{cfg.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping")
    await runner.cleanup()
    return 0
