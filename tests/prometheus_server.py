"""A real Prometheus server for tests: Debian's ``prometheus`` binary on loopback, scraping every 1 s.

Not a test module. Tests run with ``--import-mode=importlib``, so put this directory on the path
first (``monkeypatch.syspath_prepend``, as the ``prom`` fixture of ``tests/test_prometheus.py``
does) and import it by its plain name::

    with prometheus_server.PrometheusServer(["127.0.0.1:9300", "127.0.0.1:9301"]) as server:
        server.wait_for_targets_up(30)
        rows = server.wait_for("hetgmp_samples_trained_total", 10)
        for expr in dashboard_expressions():   # deploy/grafana/make_dashboard.py
            server.query(expr)                 # ValueError with Prometheus' message if invalid

Measured here: the server answers ``/-/ready`` in ~0.1 s, but the first scrape comes ~5 s after
start (Prometheus applies target updates every 5 s), and ``rate()`` needs a second scrape.

Each server gets a free port, a config file and a TSDB directory of its own in a temporary
directory, removed at :meth:`PrometheusServer.stop`. Without the binary, :meth:`~PrometheusServer.start`
raises with the command that installs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from hetgmp.runtime import free_port

__all__ = ["PrometheusServer", "PrometheusMissing"]

INSTALL_HINT = (
    "the prometheus binary (Debian package `prometheus`) is not installed; "
    "`make tools` installs it (as root), or `apt-get install -y --no-install-recommends prometheus`"
)


class PrometheusMissing(RuntimeError):
    """The ``prometheus`` binary is not on PATH."""


class PrometheusServer:
    """One Prometheus server scraping ``targets`` (``host:port``) in one job.

    Args:
        targets: ``host:port`` of each exporter; all in the job ``job``.
        job: The job name (the ``job`` label of every scraped series).
        scrape_interval_s: Scrape (and rule evaluation) interval, whole seconds.
        startup_timeout_s: How long :meth:`start` waits for ``/-/ready``.
        binary: The prometheus executable; found on PATH when None.
    """

    def __init__(
        self,
        targets: Sequence[str],
        job: str = "hetgmp",
        scrape_interval_s: int = 1,
        startup_timeout_s: float = 30.0,
        binary: str | None = None,
    ) -> None:
        self.targets = list(targets)
        self.job = job
        self.scrape_interval_s = scrape_interval_s
        self.startup_timeout_s = startup_timeout_s
        self.binary = binary
        self.port = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the HTTP API and UI."""
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        """The configuration file's text (YAML; JSON is YAML)."""
        interval = f"{self.scrape_interval_s}s"
        return json.dumps({
            "global": {"scrape_interval": interval, "scrape_timeout": interval,
                       "evaluation_interval": interval},
            "scrape_configs": [{"job_name": self.job, "static_configs": [{"targets": self.targets}]}],
        }, indent=2)

    def start(self) -> PrometheusServer:
        """Start the server and wait until it is ready to answer queries."""
        binary = self.binary or shutil.which("prometheus")
        if binary is None:
            raise PrometheusMissing(INSTALL_HINT)
        self._dir = tempfile.TemporaryDirectory(prefix="hetgmp-prometheus-")
        root = Path(self._dir.name)
        (root / "prometheus.yml").write_text(self.config())
        self.port = free_port()
        self._log = open(root / "prometheus.log", "wb")  # closed in stop()
        self._proc = subprocess.Popen(
            [binary, f"--config.file={root / 'prometheus.yml'}",
             f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with code {self._proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready after {self.startup_timeout_s} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the server (terminate, then kill) and remove its files."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
            self._log.close()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log (for failure messages)."""
        if self._dir is None:
            return ""
        return (Path(self._dir.name) / "prometheus.log").read_text(errors="replace")[-chars:]

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; returns its ``data``, raises on an error answer."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # a bad query answers 400 with a JSON error
            body = json.load(e)
        if body.get("status") != "success":
            raise ValueError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Evaluate ``expr`` now: the result list (``[{"metric": {...}, "value": [t, "v"]}]``).

        Raises:
            ValueError: Prometheus rejected the expression (its message included).
        """
        data = self.api("query", query=expr)
        result = data["result"]
        # A scalar or string result is one [t, "v"] pair; wrap it like a vector element.
        return result if data["resultType"] in ("vector", "matrix") else [{"metric": {}, "value": result}]

    def wait_for(self, expr: str, timeout: float) -> list[dict[str, Any]]:
        """Poll ``expr`` until it returns data; raises TimeoutError with the log if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if not result:
            raise TimeoutError(f"no data for {expr!r} after {timeout} s:\n{self.log_tail()}")
        return result

    def targets_health(self) -> dict[str, str]:
        """``host:port`` -> health ("up", "down", "unknown") of each active target."""
        data = self.api("targets", state="active")
        return {t["labels"]["instance"]: t["health"] for t in data["activeTargets"]}

    def wait_for_targets_up(self, timeout: float = 30.0) -> None:
        """Wait until every target has been scraped successfully at least once."""
        deadline = time.monotonic() + timeout
        health: dict[str, str] = {}
        while time.monotonic() < deadline:
            health = self.targets_health()
            if len(health) == len(self.targets) and all(h == "up" for h in health.values()):
                return
            time.sleep(0.2)
        errors = {t["labels"]["instance"]: t.get("lastError", "")
                  for t in self.api("targets", state="active")["activeTargets"]}
        raise TimeoutError(f"targets not up after {timeout} s: {health}; errors: {errors}")
