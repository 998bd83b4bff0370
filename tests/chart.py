"""The Helm chart rendered by the real Helm engine (helm-python-sdk: Helm v4's Go SDK through
its C ABI, no helm binary), once per combination of values, parsed into objects."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import helm_python as helm
import yaml

from tests.paths import REPO

CHART = REPO / "charts" / "trainjob-scheduling"
RELEASE = "trainjob-scheduling"
NAMESPACE = "trainjob-scheduling-system"
BASE = "trainjob-scheduling-webhook"  # <release>-webhook for the README's release name

Json = dict[str, Any]
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 0.5 MB of JSON


@dataclass(frozen=True)
class Rendered:
    values: Json
    objects: tuple[Json, ...]  # every rendered object, hooks included, in template order
    sources: tuple[str, ...]  # the template each object came from
    notes: str

    def kinds(self, kind: str) -> list[Json]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Json:
        found = [o for o in self.kinds(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"{len(found)} {kind} objects named {name}: {found}"
        return found[0]

    @property
    def release(self) -> list[Json]:
        """What `helm install` applies (hooks and test pods aside)."""
        return [o for o in self.objects if not hook(o)]

    @property
    def hooks(self) -> list[Json]:
        return [o for o in self.objects if hook(o)]

    @property
    def deployment(self) -> Json:
        return self.one("Deployment")

    @property
    def container(self) -> Json:
        container: Json = self.deployment["spec"]["template"]["spec"]["containers"][0]
        return container

    @property
    def args(self) -> list[str]:
        return list(self.container["args"])

    def flag(self, name: str) -> str | None:
        """The last value the args give a flag (argparse's rule: the last one wins)."""
        value = None
        for arg in self.args:
            key, _, given = arg.partition("=")
            if key == name:
                value = given
        return value


def hook(obj: Json) -> str:
    return str((obj["metadata"].get("annotations") or {}).get("helm.sh/hook", ""))


@functools.cache
def _chart() -> helm.Chart:
    return helm.Chart.load(CHART)


@functools.cache
def _render(values_json: str, release: str, namespace: str) -> Rendered:
    values = json.loads(values_json)
    manifests = _chart().render(values, name=release, namespace=namespace)
    objects: list[Json] = []
    sources: list[str] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.load_all(text, Loader=_LOADER):
            if doc is not None:
                objects.append(doc)
                sources.append(path)
    return Rendered(values, tuple(objects), tuple(sources), notes)


def render(
    values: Json | None = None, release: str = RELEASE, namespace: str = NAMESPACE
) -> Rendered:
    """The chart with `values` (Helm's own schema check and templates), cached per values."""
    return _render(json.dumps(values or {}, sort_keys=True), release, namespace)


def render_error(values: Json) -> str:
    """The message Helm refuses `values` with (a test failure if it renders)."""
    try:
        _chart().render(values, name=RELEASE, namespace=NAMESPACE)
    except helm.HelmError as err:
        return str(err)
    raise AssertionError(f"rendered without an error: {values}")


def lint(values: Json | None = None) -> Json:
    report: Json = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    return report


def leaves(values: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf of values.yaml; an empty map or list is a leaf."""
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix, values
