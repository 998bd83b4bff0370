"""Which cluster to talk to, and the cache's informers on it."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes.aio import config as kube_config
from kubernetes.aio.client import ApiClient, Configuration

from ..core.trainer import TRAINER_GROUP
from .cache import Cache, Store
from .informer import Informer, Resource

log = logging.getLogger("webhook.kube")

TRAINER = TRAINER_GROUP
TRAINJOBS = Resource(TRAINER, "v1alpha1", "trainjobs")
TRAINING_RUNTIMES = Resource(TRAINER, "v1alpha1", "trainingruntimes")
CLUSTER_RUNTIMES = Resource(TRAINER, "v1alpha1", "clustertrainingruntimes")


async def connect(
    kubeconfig: str | None, environ: Mapping[str, str] | None = None
) -> ApiClient | None:
    """The API client for: `kubeconfig` if given; else the pod's service account when running
    in a cluster; else `$KUBECONFIG`; else None (no cluster: the service runs without one)."""
    env = os.environ if environ is None else environ
    cfg = Configuration()
    load_file: Any = kube_config.load_kube_config  # untyped in the client
    if kubeconfig:
        await load_file(config_file=kubeconfig, client_configuration=cfg)
        source = kubeconfig
    elif (
        env.get("KUBERNETES_SERVICE_HOST")
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    ):
        load_incluster: Any = kube_config.load_incluster_config
        load_incluster(client_configuration=cfg)
        source = "in-cluster"
    elif env.get("KUBECONFIG"):
        await load_file(config_file=env["KUBECONFIG"], client_configuration=cfg)
        source = env["KUBECONFIG"]
    else:
        log.warning("no cluster configured: serving with an empty cache")
        return None
    log.info("cluster configured", extra={"fields": {"source": source, "server": cfg.host}})
    return ApiClient(configuration=cfg)


def informers(api: ApiClient, cache: Cache) -> list[Informer]:
    pairs: list[tuple[Resource, Store]] = [
        (TRAINJOBS, cache.trainjobs),
        (TRAINING_RUNTIMES, cache.training_runtimes),
        (CLUSTER_RUNTIMES, cache.cluster_runtimes),
    ]
    return [Informer(api, resource, store) for resource, store in pairs]
