"""Deployment files: the compose file and the Prometheus config validate with the real tools.

The tools are Debian's `docker-compose` (offline `config`) and `promtool` (from `prometheus`);
`make test` installs them when it runs as root, as CI does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian package; `make test` installs it as root)")
    return path


@pytest.mark.slow
def test_compose_file_is_valid():
    r = subprocess.run(
        [_tool("docker-compose"), "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_compose_services_point_at_real_commands():
    # Every hetgmp command in the compose file parses with our own CLI (flags included).
    r = subprocess.run(
        [_tool("docker-compose"), "-f", str(ROOT / "docker-compose.yml"), "--profile", "gpu", "config"],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )
    import yaml

    config = yaml.safe_load(r.stdout)
    from hetgmp.trainer.app.cli import build_parser

    checked = 0
    for name, service in config["services"].items():
        if service.get("image") != "hetgmp-stream:local":
            continue
        argv = service["command"]
        argv = argv.split() if isinstance(argv, str) else list(argv)
        args, extra = build_parser(argv).parse_known_args(argv)
        if argv[0] == "train":
            import argparse

            from hetgmp.trainer.app.train import add_train_flags

            train = argparse.ArgumentParser()
            add_train_flags(train)
            train.parse_args(extra)
        else:
            assert not extra, f"{name}: unknown flags {extra}"
        checked += 1
    assert checked >= 3


def test_prometheus_config_passes_promtool():
    r = subprocess.run(
        [_tool("promtool"), "check", "config", str(ROOT / "deploy/prometheus/prometheus.yml")],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_json_is_what_its_generator_writes():
    import runpy

    module = runpy.run_path(str(ROOT / "deploy/grafana/make_dashboard.py"), run_name="not_main")
    on_disk = json.loads((ROOT / "deploy/grafana/dashboards/hetgmp.json").read_text())
    assert on_disk == module["dashboard"]()
    exprs = [t["expr"] for p in on_disk["panels"] for t in p["targets"]]
    assert len(exprs) >= 20 and all(e.count("(") == e.count(")") for e in exprs)
