"""The package as the container image holds it: built into a wheel, installed into a fresh
virtualenv outside the checkout, and run from there with nothing written.

Offline and quick: the wheel is built without build isolation (setuptools comes from the test
extras), and installed with `--no-deps` into a virtualenv made `--without-pip` (as the image's
final stage has no pip) by this venv's pip (`pip --python`). Its dependencies come from this
venv's site-packages through a `.pth` line, which puts that directory on sys.path without
running the `.pth` files in it, so the editable install's hook to the checkout stays out.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from tests.paths import REPO, SAMPLES

PURELIB = sysconfig.get_paths()["purelib"]  # this venv's site-packages: the dependencies


def run(
    python: Path, *args: str, cwd: Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "WEBHOOK_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # as in the image: bytecode comes compiled
    return subprocess.run(
        [str(python), *args],
        input=stdin, capture_output=True, text=True, cwd=cwd, env=env, timeout=120, check=False,
    )  # fmt: skip


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its size and mtime, to tell whether anything was written."""
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in root.rglob("*")
        if path.is_file()
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with only the wheel installed; returns its python."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"  # a copy, so the build writes nothing into the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "webhook", source / "webhook", ignore=shutil.ignore_patterns("__pycache__")
    )
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist")]
    subprocess.run([*build, str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (work / "dist").glob("trainjob_scheduling_webhook-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [*pip, "--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True, timeout=300)
    site = Path(
        run(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=work
        ).stdout.strip()
    )
    (site / "dependencies-from-the-test-venv.pth").write_text(PURELIB + "\n")
    return python


def test_the_installed_package_is_the_wheels_not_the_checkout(installed: Path) -> None:
    venv, outside = installed.parent.parent, installed.parent.parent.parent
    code = "import sys, webhook; print(webhook.__file__); print(repr(sys.path))"
    where = run(installed, "-c", code, cwd=outside)
    assert where.returncode == 0, where.stderr
    module, path = where.stdout.splitlines()
    assert Path(module).is_relative_to(venv)
    assert str(REPO) not in ast.literal_eval(path)  # the checkout is not importable
    assert not (venv / "bin" / "pip").exists()
    site = Path(module).parent
    assert sorted(p.name for p in (site / "samples").glob("*.yaml")) == sorted(
        p.name for p in SAMPLES.glob("*.yaml")
    )
    compiled = {p.name.split(".")[0] for p in (site / "server" / "__pycache__").glob("*.pyc")}
    assert {"run", "certificates", "app"} <= compiled  # bytecode compiled at install


def test_plan_samples_and_serve_help_run_from_the_wheel_and_write_nothing(
    installed: Path, tmp_path: Path
) -> None:
    venv = installed.parent.parent
    before = tree(venv)
    listed = run(installed, "-m", "webhook", "samples", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    names = listed.stdout.split()
    assert names == sorted(p.name for p in SAMPLES.glob("*.yaml")) and len(names) >= 7
    pairs = (
        "torch-100-nodes.trainjob.yaml", "torch-distributed.runtime.yaml",
        "deepspeed-8-nodes.trainjob.yaml", "deepspeed-distributed.runtime.yaml",
        "torch-rack.trainjob.yaml", "torch-rack.runtime.yaml",
    )  # fmt: skip
    docs = run(installed, "-m", "webhook", "samples", *pairs, cwd=tmp_path)
    planned = run(installed, "-m", "webhook", "plan", "-f", "-", cwd=tmp_path, stdin=docs.stdout)
    assert planned.returncode == 0, planned.stderr
    objects = list(yaml.safe_load_all(planned.stdout))
    assert [o["kind"] for o in objects].count("Workload") == 3  # one per TrainJob
    assert [o["kind"] for o in objects].count("PodGroup") == 5  # 1 + 2 + 2
    script = venv / "bin" / "trainjob-scheduling-webhook"  # the console script the image runs
    helped = run(script, "serve", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "--cert-management {auto,self,files}" in helped.stdout
    # Usage lines name the command as it was started.
    assert helped.stdout.startswith("usage: trainjob-scheduling-webhook serve ")
    plugin = run(venv / "bin" / "kubectl-trainjob_scheduling", "--help", cwd=tmp_path)
    assert plugin.stdout.startswith("usage: kubectl trainjob-scheduling "), plugin.stderr
    module = run(installed, "-m", "webhook", "--help", cwd=tmp_path)
    assert module.stdout.startswith("usage: python -m webhook "), module.stderr
    assert tree(venv) == before  # nothing written: a read-only root filesystem would do
    assert list(tmp_path.iterdir()) == []
