"""Workload-aware (gang + topology) scheduling for Kubeflow TrainJobs: webhooks and reconciler."""

from __future__ import annotations

DISTRIBUTION = "trainjob-scheduling-webhook"
# What the version reads when the sources run without an install (no metadata to read it from).
UNKNOWN_VERSION = "unknown"


def package_version() -> str:
    """The installed package's version: pyproject.toml's, the one version source (the chart's
    version and appVersion and the Dockerfile's VERSION default are stamped from it by
    `make stamp`; tests/test_release.py pins them all equal)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # sources on the path without an install
        return UNKNOWN_VERSION


def __getattr__(name: str) -> str:
    # `webhook.__version__` read from the metadata when asked (PEP 562), so importing the package
    # costs no metadata lookup, and no literal here can fall behind pyproject.toml's.
    if name == "__version__":
        return package_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
