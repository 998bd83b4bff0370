"""`uninstall` against the API emulator over HTTP: the service's GangScheduling condition (as
its status writer applies it) and its runtime-snapshot annotation come off every TrainJob that
has them; Trainer's conditions, other annotations, Workloads and PodGroups stay; `--dry-run`
writes nothing; the command as a process, with its summary and exit codes; the warning that the
service is still installed, under any release name (by the chart's label)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import kmock
import pytest

from tests.builders import Json, trainjob
from tests.kube_emulator import (
    MUTATING_CONFIGS,
    POD_GROUPS,
    TRAINJOBS,
    VALIDATING_CONFIGS,
    WORKLOADS,
    api_client,
    create,
    delete,
    emulator,
    get,
    kubeconfig,
    next_requests,
    patch,
    status,
)
from tests.paths import REPO
from webhook.core.condition import CONDITION_TYPE, FIELD_MANAGER
from webhook.core.snapshot import SNAPSHOT_ANNOTATION
from webhook.kube import uninstall
from webhook.kube.uninstall import clean_up
from webhook.kube.writer import ApiWriter

NS = "team-a"
TRAINER_CONDITION = {
    "type": "Created",
    "status": "True",
    "reason": "JobSetCreated",
    "message": "the JobSet was created",
    "lastTransitionTime": "2026-12-01T10:00:00Z",
}
OURS = {
    "type": CONDITION_TYPE,
    "status": "True",
    "reason": "Scheduled",
    "message": "every gang is scheduled",
    "lastTransitionTime": "2026-12-01T10:00:01Z",
}


async def served_trainjob(k: Any, api: Any, name: str, *, ours: bool = True) -> Json:
    """A TrainJob as it is once the service has served it: Trainer's condition, the snapshot
    annotation (a merge patch, as the reconciler writes it), the GangScheduling condition (the
    status writer's own apply), and a Workload and PodGroup it owns."""
    job = trainjob(name, uid=None)
    job["metadata"]["annotations"] = {"team": "vision"}
    made = await create(k, TRAINJOBS, job)
    await patch(k, TRAINJOBS, NS, name, {"status": {"conditions": [TRAINER_CONDITION]}})
    if ours:
        uid = made["metadata"]["uid"]
        writer = ApiWriter(api)
        await writer.snapshot_runtime(NS, name, uid, '{"spec": {}}', None)
        await writer.apply_condition(NS, name, dict(OURS))
        owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                 "name": name, "uid": uid, "controller": True}  # fmt: skip
        for resource, kind in ((WORKLOADS, "Workload"), (POD_GROUPS, "PodGroup")):
            gang = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": kind,
                    "metadata": {"name": f"{name}-{kind.lower()}", "namespace": NS,
                                 "ownerReferences": [owner]}, "spec": {}}  # fmt: skip
            await create(k, resource, gang)
    stored = await get(k, TRAINJOBS, NS, name)
    assert stored is not None
    return stored


def condition_types(obj: Json) -> list[str]:
    return [c["type"] for c in (obj.get("status") or {}).get("conditions") or []]


def writes(k: Any, since: int) -> list[Any]:
    return [r for r in list(k)[since:] if r.method != kmock.method.GET]


def content_types(requests: list[Any]) -> list[str]:
    return [
        next((v for h, v in r.headers.items() if h.lower() == "content-type"), "") for r in requests
    ]


@pytest.mark.asyncio
async def test_the_condition_and_annotation_come_off_and_the_gangs_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(uninstall, "PAGE", 1)  # one TrainJob a page: the continue token followed
    async with emulator() as (k, url), api_client(url) as api:
        before = await served_trainjob(k, api, "served")
        assert condition_types(before) == ["Created", CONDITION_TYPE]
        assert SNAPSHOT_ANNOTATION in before["metadata"]["annotations"]
        await served_trainjob(k, api, "untouched", ours=False)

        start = len(list(k))
        dry = await clean_up(api, None, dry_run=True)
        assert writes(k, start) == []  # a dry run only lists
        assert len(list(k)[start:]) == 2  # a page for each TrainJob (the last one ends the list)
        assert dry.examined == 2
        assert [(c.name, c.condition, c.annotation) for c in dry.cleaned] == [
            ("served", True, True)
        ]

        start = len(list(k))
        done = await clean_up(api, None, dry_run=False)
        assert [(c.name, c.error) for c in done.cleaned] == [("served", "")]
        # The service's own apply took its condition off: no JSON patch was needed.
        assert content_types(writes(k, start)) == [
            "application/apply-patch+yaml",
            "application/merge-patch+json",
        ]
        after = await get(k, TRAINJOBS, NS, "served")
        assert after is not None
        assert condition_types(after) == ["Created"]  # Trainer's stays
        assert after["metadata"]["annotations"] == {"team": "vision"}
        managers = {m["manager"] for m in after["metadata"].get("managedFields") or []}
        assert FIELD_MANAGER not in managers  # nothing of ours left to own
        for resource, kind in ((WORKLOADS, "workload"), (POD_GROUPS, "podgroup")):
            assert await get(k, resource, NS, f"served-{kind}") is not None

        start = len(list(k))
        again = await clean_up(api, NS, dry_run=False)  # nothing left: no write at all
        assert (again.examined, again.cleaned, writes(k, start)) == (2, [], [])


@pytest.mark.asyncio
async def test_a_condition_another_writer_took_over_is_removed_too() -> None:
    """A merge patch of the whole condition list (as Trainer's controller can send from its
    cache) takes the condition's fields over: the empty apply leaves it, the JSON patch not."""
    async with emulator() as (k, url), api_client(url) as api:
        await served_trainjob(k, api, "taken")
        await patch(
            k, TRAINJOBS, NS, "taken", {"status": {"conditions": [TRAINER_CONDITION, OURS]}}
        )
        done = await clean_up(api, NS, dry_run=False)
        assert [(c.name, c.error) for c in done.cleaned] == [("taken", "")]
        after = await get(k, TRAINJOBS, NS, "taken")
        assert after is not None and condition_types(after) == ["Created"]


async def run(*args: str, config: Path) -> tuple[int, str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "webhook", *args, "--kubeconfig", str(config),
        cwd=REPO, env={**env, "HOME": str(config.parent)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.asyncio
async def test_the_command_says_what_it_does(tmp_path: Path) -> None:
    async with emulator() as (k, url), api_client(url) as api:
        await served_trainjob(k, api, "served")
        config = tmp_path / "kubeconfig"
        config.write_text(kubeconfig(url))

        code, out, err = await run("uninstall", "--dry-run", config=config)
        assert (code, err) == (0, ""), err
        assert out.splitlines() == [
            f"trainjob {NS}/served: would remove condition {CONDITION_TYPE} and annotation "
            f"{SNAPSHOT_ANNOTATION}",
            "1 TrainJobs examined, 1 would be cleaned, 0 failed",
        ]
        assert (
            SNAPSHOT_ANNOTATION
            in ((await get(k, TRAINJOBS, NS, "served")) or {})["metadata"]["annotations"]
        )

        code, out, err = await run("uninstall", "-n", NS, config=config)
        assert (code, err) == (0, ""), err
        assert out.splitlines()[-1] == "1 TrainJobs examined, 1 cleaned, 0 failed"

        code, out, err = await run("uninstall", "-n", "elsewhere", config=config)
        assert (code, out) == (0, "0 TrainJobs examined, 0 cleaned, 0 failed\n")

        # The service still installed (a release named "gangs": the chart names the
        # configuration gangs-trainjob-scheduling-webhook): it would write both back, and the
        # command says so.
        await create(k, MUTATING_CONFIGS, chart_configuration("gangs-trainjob-scheduling-webhook"))
        code, out, err = await run("uninstall", "--dry-run", config=config)
        assert code == 0 and err.startswith(
            "Warning: the service's webhook configuration is still installed "
            "(MutatingWebhookConfiguration gangs-trainjob-scheduling-webhook)"
        ), err


def chart_configuration(name: str, part_of: str = "trainjob-scheduling") -> Json:
    """A webhook configuration with the labels the chart gives it (tjs.labels)."""
    labels = {
        "app.kubernetes.io/name": "trainjob-scheduling",
        "app.kubernetes.io/instance": name.split("-")[0],
        "app.kubernetes.io/part-of": part_of,
        "app.kubernetes.io/component": "webhook",
    }
    return {"metadata": {"name": name, "labels": labels}, "webhooks": []}


@pytest.mark.asyncio
async def test_installed_configurations_are_found_by_the_charts_label() -> None:
    """Any release name or fullnameOverride: found by the label every chart object carries; a
    configuration of another product is not the service's, whatever its name."""
    async with emulator() as (k, url), api_client(url) as api:
        assert await uninstall.installed_configurations(api) == []
        await create(k, MUTATING_CONFIGS, chart_configuration("other-product", part_of="other"))
        assert await uninstall.installed_configurations(api) == []
        await create(k, MUTATING_CONFIGS, chart_configuration("custom-webhook"))  # fullnameOverride
        await create(k, MUTATING_CONFIGS, chart_configuration("b-trainjob-scheduling-webhook"))
        assert await uninstall.installed_configurations(api) == [
            "MutatingWebhookConfiguration b-trainjob-scheduling-webhook",
            "MutatingWebhookConfiguration custom-webhook",
        ]
        # The validating one alone (its snapshot guard refuses the annotation's removal).
        for name in ("b-trainjob-scheduling-webhook", "custom-webhook"):
            await delete(k, MUTATING_CONFIGS, None, name)
        await create(k, VALIDATING_CONFIGS, chart_configuration("b-trainjob-scheduling-webhook"))
        assert await uninstall.installed_configurations(api) == [
            "ValidatingWebhookConfiguration b-trainjob-scheduling-webhook"
        ]


@pytest.mark.asyncio
async def test_without_list_the_default_name_is_read() -> None:
    """A user without `list` on mutatingwebhookconfigurations: the default release's
    configuration is still found by `get` (and a refused `get` is said as nothing found)."""
    async with emulator() as (k, url), api_client(url) as api:
        await create(k, MUTATING_CONFIGS, {"metadata": {"name": FIELD_MANAGER}, "webhooks": []})
        next_requests(k[kmock.action.LIST, MUTATING_CONFIGS], 2) << status(403, reason="Forbidden")
        assert await uninstall.installed_configurations(api) == [
            f"MutatingWebhookConfiguration {FIELD_MANAGER}"
        ]
        next_requests(k[MUTATING_CONFIGS], 2) << status(403, reason="Forbidden")
        assert await uninstall.installed_configurations(api) == []


@pytest.mark.asyncio
async def test_no_cluster_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig("http://127.0.0.1:9"))  # nothing listens on the discard port
    code, out, err = await run("uninstall", config=config)
    assert (code, out) == (1, "")
    assert err.startswith("error: cannot list TrainJobs: ")
