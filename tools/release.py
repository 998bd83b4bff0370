"""`make release`: the release's files in dist/, all from one version (pyproject.toml's).

    python -m tools.release [--dist DIR] [--url URL]   # every artefact, then SHA256SUMS
    python -m tools.release --stamp                    # the chart's versions and the
                                                       # Dockerfile's VERSION := the package's

What it makes (names carry the version V):

* trainjob_scheduling_webhook-V-py3-none-any.whl: the package (pip wheel, offline: no build
  isolation, setuptools from the test extras);
* trainjob-scheduling-V.tgz: the chart, packaged by Helm's own engine (helm-python-sdk, as the
  chart tests render it) with version and appVersion V; `helm push` sends it to an OCI registry;
* sbom.cdx.json: a CycloneDX SBOM of the image's Python environment, read from requirements.lock
  (what the Dockerfile installs, with --require-hashes), the service as its root component;
* kubectl-trainjob_scheduling-V.tar.gz: the kubectl plugin (a launcher, the wheel and the lock
  file; the launcher makes a virtualenv on first use) and trainjob-scheduling.yaml, its krew
  manifest (the archive's URL under --url, and its sha256);
* SHA256SUMS: `sha256sum -c` checks every file above.

Reproducible: the wheel is built with SOURCE_DATE_EPOCH at the last commit's time, the archives
are written with fixed times, owners and order, and the SBOM with --output-reproducible, so two
runs on one commit give the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "trainjob-scheduling"
DOCKERFILE = REPO / "Dockerfile"
LOCK = REPO / "requirements.lock"
PLUGIN = "trainjob-scheduling"  # `kubectl trainjob-scheduling`
PLUGIN_BIN = "kubectl-trainjob_scheduling"  # kubectl's name for it: dashes as underscores
DEFAULT_URL = "https://downloads.example.invalid/trainjob-scheduling/v{version}"
HOMEPAGE = "https://downloads.example.invalid/trainjob-scheduling"
# The platforms krew offers the plugin on: the launcher is a POSIX shell script and the wheel is
# pure Python (the compiled dependencies come from PyPI for the user's machine).
PLATFORMS = [(system, arch) for system in ("linux", "darwin") for arch in ("amd64", "arm64")]


def package_version() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return str(project["version"])


def chart_versions() -> tuple[str, str]:
    """The chart's version and appVersion, as Chart.yaml has them."""
    import yaml

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return str(chart["version"]), str(chart["appVersion"])


def dockerfile_version() -> str:
    """The Dockerfile's `ARG VERSION=` default: the image's version label when it is built
    without `make image` (which passes pyproject.toml's as --build-arg VERSION)."""
    found = re.search(r"(?m)^ARG VERSION=(.*)$", DOCKERFILE.read_text())
    return found[1].strip() if found else ""


def _stamp_file(path: Path, replacements: list[tuple[str, str]]) -> bool:
    text = path.read_text()
    stamped = text
    for pattern, replacement in replacements:
        stamped = re.sub(pattern, replacement, stamped)
    if stamped != text:
        path.write_text(stamped)
    return stamped != text


def stamp(version: str) -> bool:
    """Writes `version` into Chart.yaml's version and appVersion and the Dockerfile's VERSION
    default (comments kept); True if it changed anything."""
    chart = _stamp_file(
        CHART / "Chart.yaml",
        [(r"(?m)^version: .*$", f"version: {version}"),
         (r"(?m)^appVersion: .*$", f'appVersion: "{version}"')],
    )  # fmt: skip
    image = _stamp_file(DOCKERFILE, [(r"(?m)^ARG VERSION=.*$", f"ARG VERSION={version}")])
    return chart or image


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_date_epoch(source: Path = REPO) -> str:
    """The last commit's time (reproducible builds' SOURCE_DATE_EPOCH): the wheel's file times,
    so the same commit gives the same wheel; 1980 (the zip format's first date) outside git."""
    done = subprocess.run(
        ["git", "-C", str(source), "log", "-1", "--format=%ct"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    stamp = done.stdout.strip()
    return stamp if done.returncode == 0 and stamp.isdigit() else "315532800"


# Outside git, what a copy of the tree leaves out: earlier builds' output, and caches.
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "site", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
)


def tracked_copy(source: Path, into: Path) -> Path:
    """The files git tracks in `source` (as the working tree has them), copied into `into`: a
    build there sees no earlier build/ (whose build/lib would ship modules deleted since) and no
    untracked file. Outside git, the tree without build output and caches."""
    listed = subprocess.run(
        ["git", "-C", str(source), "ls-files", "-z", "--cached"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    if listed.returncode != 0:
        shutil.copytree(source, into, ignore=_NOT_SOURCES, symlinks=True)
        return into
    into.mkdir(parents=True)
    for name in sorted({n for n in listed.stdout.decode().split("\0") if n}):
        path = source / name
        if not path.is_file():  # deleted in the working tree, not yet in a commit
            continue
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, into / name)
    return into


def build_wheel(dist: Path, source: Path = REPO) -> Path:
    """The wheel, built in a fresh copy of the tracked files (setuptools builds in the tree it
    is given, and reuses what an earlier build left in build/)."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheel-build-") as scratch:
        tree = tracked_copy(source, Path(scratch) / "src")
        subprocess.run(
            [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist.resolve()),
             str(tree)],
            check=True, timeout=600,
            env={**os.environ, "SOURCE_DATE_EPOCH": source_date_epoch(source)},
        )  # fmt: skip
    (wheel,) = dist.glob("trainjob_scheduling_webhook-*.whl")
    return wheel


def package_chart(dist: Path, version: str) -> Path:
    """Helm's package, its entries' times set to the last commit's (Helm writes each file's own
    time, which differs between clones) and its gzip header's to zero: same commit, same bytes."""
    import helm_python as helm

    packaged = Path(helm.package(CHART, destination=dist, version=version, app_version=version))
    when = int(source_date_epoch())
    buffer = io.BytesIO()
    with (
        tarfile.open(packaged, "r:gz") as source,
        tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as target,
    ):
        for member in source.getmembers():
            data = source.extractfile(member) if member.isfile() else None
            member.mtime, member.uid, member.gid, member.uname, member.gname = when, 0, 0, "", ""
            member.pax_headers = {}
            target.addfile(member, data)
    with packaged.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped:
        zipped.write(buffer.getvalue())
    return packaged


def sbom(dist: Path) -> Path:
    out = dist / "sbom.cdx.json"
    tool = Path(sys.executable).parent / "cyclonedx-py"
    subprocess.run(
        [str(tool), "requirements", "--pyproject", str(REPO / "pyproject.toml"),
         "--output-reproducible", "--of", "JSON", "-o", str(out), str(LOCK)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    return out


LAUNCHER = """#!/bin/sh
# kubectl trainjob-scheduling {version}: runs the command line from a virtualenv made on first
# use (python3 >= 3.11 needed) from the wheel and the hash-checked lock file beside this script.
set -eu
here=$(dirname "$(python3 -c 'import os, sys; print(os.path.realpath(sys.argv[1]))' "$0")")
venv="${{XDG_CACHE_HOME:-$HOME/.cache}}/trainjob-scheduling/{version}"
if [ ! -x "$venv/bin/{bin}" ]; then
  rm -rf "$venv.partial"
  python3 -m venv "$venv.partial"
  "$venv.partial/bin/python" -m pip install --quiet --require-hashes -r "$here/requirements.lock"
  "$venv.partial/bin/python" -m pip install --quiet --no-deps "$here/{wheel}"
  rm -rf "$venv" && mv "$venv.partial" "$venv"
fi
exec "$venv/bin/{bin}" "$@"
"""


def _add(archive: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    archive.addfile(info, io.BytesIO(data))


def plugin_archive(dist: Path, version: str, wheel: Path) -> Path:
    """The krew plugin's archive, byte for byte the same for the same inputs."""
    out = dist / f"{PLUGIN_BIN}-{version}.tar.gz"
    launcher = LAUNCHER.format(version=version, bin=PLUGIN_BIN, wheel=wheel.name)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        _add(archive, PLUGIN_BIN, launcher.encode(), 0o755)
        _add(archive, "requirements.lock", LOCK.read_bytes(), 0o644)
        _add(archive, wheel.name, wheel.read_bytes(), 0o644)
    with out.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped:
        zipped.write(buffer.getvalue())
    return out


def krew_manifest(dist: Path, version: str, archive: Path, url: str) -> Path:
    """The krew index's Plugin object for `kubectl krew install --manifest=...`."""
    import yaml

    digest = sha256(archive)
    manifest = {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": PLUGIN},
        "spec": {
            "version": f"v{version}",
            "homepage": HOMEPAGE,
            "shortDescription": "Explain and clean up gang-scheduled TrainJobs",
            "description": (
                "Explains why a Kubeflow TrainJob waits (its plan, gang objects, pods and whether "
                "its gangs could ever fit), prints the Workload and PodGroups a TrainJob would "
                "get, and removes the service's condition and annotation from TrainJobs before an "
                "uninstall. Needs python3 (3.11 or newer): the first run makes a virtualenv."
            ),
            "platforms": [
                {
                    "selector": {"matchLabels": {"os": system, "arch": arch}},
                    "uri": f"{url.rstrip('/')}/{archive.name}",
                    "sha256": digest,
                    "bin": PLUGIN_BIN,
                }
                for system, arch in PLATFORMS
            ],
        },
    }
    out = dist / f"{PLUGIN}.yaml"
    out.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return out


def checksums(dist: Path) -> Path:
    out = dist / "SHA256SUMS"
    files = sorted(p for p in dist.iterdir() if p.is_file() and p.name != out.name)
    out.write_text("".join(f"{sha256(p)}  {p.name}\n" for p in files))
    return out


def release(dist: Path, url: str) -> list[Path]:
    version = package_version()
    if chart_versions() != (version, version):
        raise SystemExit(
            f"error: Chart.yaml's version/appVersion {chart_versions()} are not the package's "
            f"{version}: run `make stamp` and commit"
        )
    if dockerfile_version() != version:
        raise SystemExit(
            f"error: the Dockerfile's VERSION default {dockerfile_version()!r} is not the "
            f"package's {version}: run `make stamp` and commit"
        )
    if dist.exists():
        shutil.rmtree(dist)
    dist.mkdir(parents=True)
    wheel = build_wheel(dist)
    made = [wheel, package_chart(dist, version), sbom(dist)]
    archive = plugin_archive(dist, version, wheel)
    made += [archive, krew_manifest(dist, version, archive, url.format(version=version))]
    return [*made, checksums(dist)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.release", description=__doc__)
    parser.add_argument("--dist", default=str(REPO / "dist"), help="output directory")
    parser.add_argument(
        "--url", default=DEFAULT_URL,
        help="where the release's files will be downloadable ({version} is replaced): the "
        "krew manifest points there (default: %(default)s, a placeholder)",
    )  # fmt: skip
    parser.add_argument(
        "--stamp", action="store_true", help="only stamp the chart's versions and the Dockerfile's"
    )
    args = parser.parse_args(argv)
    if args.stamp:
        version = package_version()
        changed = stamp(version)
        said = "" if changed else " (as was)"
        print(f"Chart.yaml version and appVersion, Dockerfile VERSION: {version}{said}")
        return 0
    for path in release(Path(args.dist), args.url):
        print(path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
