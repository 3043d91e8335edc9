"""``hetgmp serve`` as a child process, for the tests that talk to it over HTTP (imported by
its plain name, as ``exact_jobs`` is)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from hetgmp.streaming.kafka import KafkaSettings

TSV = "text/tab-separated-values"


class Serve:
    """A ``hetgmp serve`` process; its output is drained into ``lines``."""

    def __init__(self, root: Path, kafka: KafkaSettings, *flags: str, port: int = 0,
                 wait: bool = True) -> None:
        self.lines: list[str] = []
        self.url = ""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hetgmp.trainer.app.cli", "serve", "--checkpoint-dir", str(root),
             "--bootstrap-servers", kafka.bootstrap_servers, "--port", str(port), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        threading.Thread(target=self._drain, daemon=True).start()
        if wait:
            self.listening()

    def listening(self, timeout_s: float = 90) -> str:
        """Wait until it listens (it first waits for a checkpoint); its base URL."""
        self.url = self._wait_for(r"listening on (http://\S+)", timeout_s)
        return self.url

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def _wait_for(self, pattern: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} from hetgmp serve:\n" + "\n".join(self.lines))

    def request(self, path: str, body: bytes | None = None, ctype: str | None = TSV
                ) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, data=body,
                                     method="POST" if body is not None else "GET")
        if body is not None and ctype is not None:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, data = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        text = data.decode()
        return status, (json.loads(text) if text.startswith("{") else text)

    def ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while self.request("/readyz")[0] != 200:
            assert time.monotonic() < deadline, "\n".join(self.lines)
            time.sleep(0.1)

    def metric(self, name: str) -> float:
        _, text = self.request("/metrics")
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        assert m, f"{name} not in /metrics"
        return float(m.group(1))

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(30)

    def stopped_cleanly(self) -> None:
        code = self.stop()
        assert code == 0, f"exit {code}:\n" + "\n".join(self.lines[-30:])
