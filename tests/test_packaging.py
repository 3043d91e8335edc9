"""Installed, the package is one import name, ``hetgmp`` (issue 56): the wheel holds every module
of the repository's folders under it and nothing at the top of site-packages beside it, so it
installs beside MosaicML's ``streaming`` (``mosaicml-streaming``) and leaves that name to it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("runtime", "streaming", "partitioner", "trainer")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy of what the wheel is made of: setuptools builds in the source tree,
    # and a build/ left there from an older layout would go into the wheel.
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in (*FOLDERS, "hetgmp"):
        shutil.copytree(ROOT / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, timeout=300)
    (found,) = out.glob("hetgmp_stream-*.whl")
    return found


def test_the_wheel_holds_every_module_under_hetgmp_and_nothing_else(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"hetgmp", "hetgmp_stream-0.1.0.dist-info"}, tops
    for folder in FOLDERS:
        modules = {f"hetgmp/{p.relative_to(ROOT).as_posix()}"
                   for p in (ROOT / folder).rglob("*.py")}
        missing = modules - set(names)
        assert not missing, f"not in the wheel: {sorted(missing)[:5]}"


@pytest.mark.slow
def test_the_wheel_installs_beside_mosaicml_streaming(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # No dependencies: what is checked is who owns which import name, not the libraries.
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel),
                    "mosaicml-streaming==0.13.0"], check=True, timeout=600)
    probe = (
        "import importlib.metadata as md, importlib.util as u, json, hetgmp\n"
        "spec = u.find_spec('streaming')\n"
        "theirs = {str(f) for f in md.files('mosaicml-streaming')}\n"
        "print(json.dumps({'hetgmp': hetgmp.__file__, 'streaming': spec and spec.origin,\n"
        "  'theirs': 'streaming/__init__.py' in theirs,\n"
        "  'bare': [n for n in ('trainer', 'runtime', 'partitioner') if u.find_spec(n)],\n"
        "  'ours': sorted({str(f).split('/')[0] for f in md.files('hetgmp-stream')\n"
        "                  if not str(f).startswith('..')})}))\n")
    r = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["streaming"] and got["streaming"].endswith("site-packages/streaming/__init__.py")
    assert got["theirs"], got  # the `streaming` found is MosaicML's file
    assert got["bare"] == [], got
    # Our files in site-packages: the package and its metadata (the script lies in bin/).
    assert got["ours"] == ["hetgmp", "hetgmp_stream-0.1.0.dist-info"], got
