"""``hetgmp serve``: answer predictions from the freshest rows the trainer published.

Listens at once; loads the newest complete checkpoint of ``--checkpoint-dir`` (waiting for one
if there is none yet), follows the model delta log from the offsets that checkpoint covers,
and serves ``/predict``, ``/healthz``, ``/readyz`` and ``/metrics``
(:mod:`hetgmp.trainer.serving.server`); until it has a model, ``/predict`` and ``/readyz`` answer 503
and say what it waits for. Several serve processes can follow one log. SIGINT/SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from hetgmp.runtime import add_flags, directory_problem
from hetgmp.streaming import KafkaSettings, parse_schema
from hetgmp.trainer.app.commands import settings
from hetgmp.trainer.serving import ServeConfig

if TYPE_CHECKING:  # torch and the model come with these: loaded once serve runs, not for --help
    from hetgmp.trainer.serving import FollowerThread, Service

__all__ = ["Loader", "add_serve_flags", "listen", "run_serve"]

log = logging.getLogger("hetgmp.serve")

# After a reply to a request whose body was not read whole (408, 413), aiohttp keeps reading
# for this long so that the client sees the reply before the close (its default, 10 s, would
# let a stalled client hold the connection that much longer).
LINGER_S = 1.0


def add_serve_flags(parser: argparse.ArgumentParser, toml: dict[str, Any]) -> None:
    """The flags of ``hetgmp serve``."""
    add_flags(parser.add_argument_group("serve", "the model and the HTTP server"), ServeConfig,
              "serve", toml=toml)
    add_flags(parser.add_argument_group("kafka", "how to reach the cluster (the delta log)"),
              KafkaSettings, "kafka", toml=toml)


def _check_paths(cfg: ServeConfig) -> str:
    """Why the settings' paths cannot work ('' = they can), before anything starts."""
    if not cfg.checkpoint_dir:
        return "--checkpoint-dir is required (the training job's)"
    problem = directory_problem("--checkpoint-dir", cfg.checkpoint_dir, write=False)
    if problem:
        return problem
    from hetgmp.trainer.serving import load_signer

    try:
        load_signer(cfg.delta_key_file)
    except ValueError as exc:
        return f"--delta-key-file: {exc}"
    return ""


class Loader(threading.Thread):
    """Everything serve waits for, off the event loop: a checkpoint, the model, the delta log.

    The HTTP side answers from the start; :attr:`Service.waiting_for` says what this is
    waiting for, and :attr:`Service.failed` (with :attr:`exit_code`) why it gave up.
    """

    def __init__(self, service: Service, cfg: ServeConfig, kafka: KafkaSettings,
                 done: Callable[[], object]) -> None:
        super().__init__(name="serve-loader", daemon=True)
        self.service, self.cfg, self.kafka, self._done = service, cfg, kafka, done
        self.exit_code = 0
        self.follower: FollowerThread | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            self._load()
        except Exception as exc:  # the process cannot serve: say so and stop it
            self._fail(1, f"{type(exc).__name__}: {exc}")

    def _fail(self, code: int, message: str) -> None:
        self.exit_code = code
        self.service.failed = message
        print(f"hetgmp serve: error: {message}", file=sys.stderr, flush=True)
        self._done()

    def _load(self) -> None:
        from hetgmp.trainer import checkpoint as ckpt
        from hetgmp.trainer.serving import Follower, FollowerThread, ServingModel, load_signer

        cfg, service = self.cfg, self.service
        service.waiting_for = f"a complete checkpoint in {cfg.checkpoint_dir}"
        manifest = self._wait_for_checkpoint()
        if manifest is None:
            if not self._halt.is_set():
                self._fail(1, f"no complete checkpoint in {cfg.checkpoint_dir} after "
                              f"{cfg.wait_s:g} s")
            return
        service.waiting_for = f"loading {manifest.path}"
        try:
            model = ServingModel.from_checkpoint(manifest, memory_rows=cfg.memory_rows,
                                                 disk_dir=cfg.disk_dir)
        except ckpt.CheckpointError as exc:
            self._fail(1, str(exc))
            return
        schema = service.schema
        if (len(schema.sparse), len(schema.dense)) != (model.fields, model.n_dense):
            self._fail(2, f"--schema has {len(schema.sparse)} sparse and {len(schema.dense)} "
                          f"dense fields; the model was trained on {model.fields} and "
                          f"{model.n_dense}")
            return
        log.info("loaded %s (step %d): %d rows%s", manifest.path, manifest.step,
                 len(model.table), f" ({model.table.memory_size:,} in memory, the rest in "
                 f"{cfg.disk_dir})" if cfg.disk_dir else "")
        if not cfg.follow:
            service.attach(model, None)
            return
        assert manifest.model is not None  # from_checkpoint refuses a checkpoint without one
        topic = cfg.model_topic or manifest.model.topic
        # Scores from the checkpoint while Kafka is reached (not ready until caught up).
        service.attach(model, None)
        service.waiting_for = f"the delta log {topic} at {self.kafka.bootstrap_servers}"
        follower = Follower(self.kafka, topic, model, manifest.model.offsets,
                            signer=load_signer(cfg.delta_key_file), client=cfg.client)
        self.follower = FollowerThread(follower)
        if self._halt.is_set():
            follower.close()
            return
        self.follower.start()
        service.attach(model, self.follower)
        log.info("following %s from offsets %s", topic, manifest.model.offsets)

    def _wait_for_checkpoint(self) -> Any:
        from hetgmp.trainer import checkpoint as ckpt

        wait_s = self.cfg.wait_s
        deadline = time.monotonic() + wait_s if wait_s > 0 else float("inf")
        said = False
        while not self._halt.is_set():
            found = ckpt.latest(self.cfg.checkpoint_dir)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                return None
            if not said:
                log.info("no complete checkpoint in %s yet: waiting for the trainer's first "
                         "(docs/serving.md)", self.cfg.checkpoint_dir)
                said = True
            self._halt.wait(1.0)
        return None

    def stop(self) -> None:
        """Stop waiting, and stop the follower if it runs."""
        self._halt.set()
        if self.follower is not None and self.follower.is_alive():
            self.follower.stop()


def run_serve(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM; 0 stopped, 1 failed, 2 refused settings."""
    import torch

    from hetgmp.trainer.serving import Service

    cfg = settings(ServeConfig, args)
    kafka = settings(KafkaSettings, args)
    problem = _check_paths(cfg)
    if problem:
        print(f"hetgmp serve: error: {problem}", file=sys.stderr)
        return 2
    try:
        schema = parse_schema(cfg.schema)
    except ValueError as exc:
        print(f"hetgmp serve: error: --schema: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    service = Service(None, None, schema, cfg.format, cfg.max_record_bytes, cfg.max_records,
                      cfg.threads, cfg.max_inflight_bytes, value_separator=cfg.value_separator)
    try:
        return asyncio.run(_serve(service, cfg, kafka))
    finally:
        service.pool.shutdown(wait=False)


async def listen(service: Service, cfg: ServeConfig) -> tuple[Any, int]:
    """Serve ``service``'s routes on ``cfg``'s address with its limits: (the aiohttp runner,
    to ``cleanup()``; the port).

    Raises:
        OSError: The address cannot be listened on.
    """
    from aiohttp import web

    from hetgmp.trainer.serving import build_app

    # aiohttp's keep-alive timer runs from a connection's opening and after every reply, and
    # closes it while no whole request head has arrived: the header timeout.
    runner = web.AppRunner(build_app(service, cfg.max_body_bytes, cfg.body_timeout_s),
                           access_log=None, keepalive_timeout=cfg.header_timeout_s,
                           lingering_time=LINGER_S)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1] if runner.addresses else cfg.port


async def _serve(service: Service, cfg: ServeConfig, kafka: KafkaSettings) -> int:
    try:
        runner, port = await listen(service, cfg)
    except OSError as exc:
        print(f"hetgmp serve: error: cannot listen on {cfg.host}:{cfg.port}: {exc}",
              file=sys.stderr)
        return 1
    # One line a supervisor (or a test) can wait for; /healthz answers from now on.
    print(f"hetgmp serve: listening on http://{cfg.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loader = Loader(service, cfg, kafka, lambda: loop.call_soon_threadsafe(stop.set))
    loader.start()
    await stop.wait()
    log.info("stopping")
    loader.stop()
    await runner.cleanup()
    return loader.exit_code
