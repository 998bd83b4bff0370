"""The release (`make release`: tools/release.py) from one version source, pyproject.toml's:
the chart's version and appVersion, `--version`, and every artefact in dist/ carry it; the SBOM
lists every package the lock file pins; the krew manifest's sha256 is its archive's; SHA256SUMS
checks every file; the wheel and the plugin archive are byte for byte the same when made twice,
and the wheel holds only tracked files (never an earlier build's leftovers)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import webhook
from tests.paths import REPO
from tools import release

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def locked() -> dict[str, str]:
    """requirements.lock's pins, by normalised name."""
    pins = re.findall(
        r"(?m)^([A-Za-z0-9._-]+)==([^ \\\n]+)", (REPO / "requirements.lock").read_text()
    )
    return {canonicalize_name(name): version for name, version in pins}


def test_the_lock_file_satisfies_the_dependencies() -> None:
    """Every runtime dependency of pyproject.toml that applies in the image (CPython 3.11 on
    Linux) is locked at a version its specifier allows, with hashes: a changed dependency
    without `make lock` fails here."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = locked()
    image = {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux"}
    for text in project["dependencies"]:
        wanted = Requirement(text)
        if wanted.marker is not None and not wanted.marker.evaluate(image):
            continue
        name = canonicalize_name(wanted.name)
        assert name in pins, f"{name} is not in requirements.lock: run make lock"
        assert wanted.specifier.contains(pins[name]), f"{name}=={pins[name]} is not {wanted}"
    blocks = re.split(r"(?m)^(?=[A-Za-z0-9])", (REPO / "requirements.lock").read_text())
    for block in (b for b in blocks if "==" in b):
        assert "--hash=sha256:" in block, block.splitlines()[0]


def test_the_chart_carries_the_package_version() -> None:
    chart = yaml.safe_load((REPO / "charts" / "trainjob-scheduling" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION), "run make stamp"


def test_version_is_the_package_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "--version"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout == f"python -m webhook {VERSION}\n"


def test_every_version_is_the_package_version() -> None:
    """pyproject.toml's version is the only one written by hand: the package's `__version__`
    reads the installed metadata, and `make stamp` writes the chart's and the Dockerfile's."""
    assert webhook.__version__ == VERSION
    assert webhook.package_version() == VERSION
    assert release.dockerfile_version() == VERSION, "run make stamp"
    assert release.chart_versions() == (VERSION, VERSION), "run make stamp"
    assert "__version__ =" not in (REPO / "webhook" / "__init__.py").read_text()  # no literal


def test_the_version_without_an_install_says_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert webhook.__version__ == webhook.UNKNOWN_VERSION == "unknown"
    assert not hasattr(webhook, "no_such_attribute")  # only __version__ is made up


def test_stamp_writes_the_package_version_into_the_chart_and_the_dockerfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chart = tmp_path / "chart"
    chart.mkdir()
    original = (REPO / "charts" / "trainjob-scheduling" / "Chart.yaml").read_text()
    (chart / "Chart.yaml").write_text(
        original.replace(f"version: {VERSION}", "version: 0.0.1").replace(
            f'appVersion: "{VERSION}"', 'appVersion: "0.0.1"'
        )
    )
    dockerfile = tmp_path / "Dockerfile"
    original_dockerfile = (REPO / "Dockerfile").read_text()
    assert f"ARG VERSION={VERSION}\n" in original_dockerfile
    dockerfile.write_text(
        original_dockerfile.replace(f"ARG VERSION={VERSION}", "ARG VERSION=0.0.1")
    )
    monkeypatch.setattr(release, "CHART", chart)
    monkeypatch.setattr(release, "DOCKERFILE", dockerfile)
    assert release.dockerfile_version() == "0.0.1"
    with pytest.raises(SystemExit, match="run `make stamp`"):  # no release from stale versions
        release.release(tmp_path / "dist", release.DEFAULT_URL)
    assert release.stamp(VERSION)
    assert (chart / "Chart.yaml").read_text() == original  # comments and all kept
    assert dockerfile.read_text() == original_dockerfile
    assert not release.stamp(VERSION)
    # Only the Dockerfile behind: stamped too.
    dockerfile.write_text(original_dockerfile.replace(f"ARG VERSION={VERSION}", "ARG VERSION=9"))
    assert release.stamp(VERSION) and dockerfile.read_text() == original_dockerfile


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release") / "dist"
    release.release(out, "https://downloads.example.invalid/v{version}")
    return out


def test_release_makes_every_artefact(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == sorted(
        [
            f"trainjob_scheduling_webhook-{VERSION}-py3-none-any.whl",
            f"trainjob-scheduling-{VERSION}.tgz",
            "sbom.cdx.json",
            f"kubectl-trainjob_scheduling-{VERSION}.tar.gz",
            "trainjob-scheduling.yaml",
            "SHA256SUMS",
        ]
    )
    sums: dict[str, str] = {}
    for line in (dist / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)  # sha256sum's form: `sha256sum -c` reads it
        sums[name] = digest
    assert set(sums) == {p.name for p in dist.iterdir()} - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256((dist / name).read_bytes()).hexdigest() == digest, name


def test_the_packaged_chart_carries_the_version(dist: Path) -> None:
    with tarfile.open(dist / f"trainjob-scheduling-{VERSION}.tgz") as archive:
        member = archive.extractfile("trainjob-scheduling/Chart.yaml")
        assert member is not None
        chart = yaml.safe_load(member.read())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)
    # Helm's own loader takes the archive as written.
    loaded = helm.Chart.load(dist / f"trainjob-scheduling-{VERSION}.tgz")
    try:
        assert (loaded.name, loaded.version) == ("trainjob-scheduling", VERSION)
    finally:
        loaded.close()


def test_the_sbom_lists_every_locked_package(dist: Path) -> None:
    sbom = json.loads((dist / "sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    root = sbom["metadata"]["component"]
    assert (root["name"], root["version"]) == ("trainjob-scheduling-webhook", VERSION)
    listed = {re.sub(r"[-_.]+", "-", c["name"]).lower(): c["version"] for c in sbom["components"]}
    pins = locked()
    assert len(pins) > 20  # the lock file read, not an empty match
    assert listed == pins
    for component in sbom["components"]:
        assert component["purl"] == f"pkg:pypi/{component['name']}@{component['version']}"


def test_the_krew_manifest_points_at_its_archive(dist: Path) -> None:
    manifest = yaml.safe_load((dist / "trainjob-scheduling.yaml").read_text())
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert (manifest["kind"], manifest["metadata"]["name"]) == ("Plugin", "trainjob-scheduling")
    assert manifest["spec"]["version"] == f"v{VERSION}"
    archive = dist / f"kubectl-trainjob_scheduling-{VERSION}.tar.gz"
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    platforms = manifest["spec"]["platforms"]
    assert {(p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"])
            for p in platforms} == {("linux", "amd64"), ("linux", "arm64"),
                                    ("darwin", "amd64"), ("darwin", "arm64")}  # fmt: skip
    for platform in platforms:
        assert platform["sha256"] == digest
        assert platform["uri"] == f"https://downloads.example.invalid/v{VERSION}/{archive.name}"
        assert platform["bin"] == "kubectl-trainjob_scheduling"


def test_the_plugin_archive_holds_a_launcher_the_wheel_and_the_lock(
    dist: Path, tmp_path: Path
) -> None:
    archive = dist / f"kubectl-trainjob_scheduling-{VERSION}.tar.gz"
    with tarfile.open(archive) as opened:
        members = {m.name: m for m in opened.getmembers()}
        assert sorted(members) == sorted(
            [
                "kubectl-trainjob_scheduling",
                "requirements.lock",
                f"trainjob_scheduling_webhook-{VERSION}-py3-none-any.whl",
            ]
        )
        assert members["kubectl-trainjob_scheduling"].mode == 0o755
        launcher = opened.extractfile("kubectl-trainjob_scheduling")
        assert launcher is not None
        script = tmp_path / "launcher"
        script.write_bytes(launcher.read())
    subprocess.run(["sh", "-n", str(script)], check=True, timeout=30)  # it parses
    assert "--require-hashes" in script.read_text()
    # Reproducible: made again from the same wheel, the same bytes.
    again = tmp_path / "again"
    again.mkdir()
    wheel = dist / f"trainjob_scheduling_webhook-{VERSION}-py3-none-any.whl"
    assert release.plugin_archive(again, VERSION, wheel).read_bytes() == archive.read_bytes()


def test_the_wheel_is_the_same_when_built_again(dist: Path, tmp_path: Path) -> None:
    """SOURCE_DATE_EPOCH (the last commit's time) fixes the wheel's file times."""
    wheel = dist / f"trainjob_scheduling_webhook-{VERSION}-py3-none-any.whl"
    assert release.build_wheel(tmp_path).read_bytes() == wheel.read_bytes()


def test_the_wheel_holds_only_tracked_files(tmp_path: Path) -> None:
    """A module left in build/lib by an earlier build (deleted since) and an untracked module in
    the package stay out of the wheel: it is built from a fresh copy of the tracked files."""
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-local", "--depth", "1", f"file://{REPO}", str(clone)],
        check=True, timeout=120, capture_output=True,
    )  # fmt: skip
    stale = clone / "build" / "lib" / "webhook" / "deleted_since.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("GONE = True\n")
    (clone / "webhook" / "untracked.py").write_text("NOT_COMMITTED = True\n")
    wheel = release.build_wheel(tmp_path / "dist", clone)
    with zipfile.ZipFile(wheel) as opened:
        names = opened.namelist()
    assert "webhook/__init__.py" in names and "webhook/samples/" not in names
    assert any(n.startswith("webhook/samples/") and n.endswith(".yaml") for n in names)
    assert "webhook/deleted_since.py" not in names
    assert "webhook/untracked.py" not in names
    # Nothing written into the tree built from.
    assert not list(clone.glob("*.egg-info")) and sorted(
        p.name for p in (clone / "build").iterdir()
    ) == ["lib"]
