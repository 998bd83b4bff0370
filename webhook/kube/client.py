"""Which cluster to talk to, and the cache's informers on it."""

from __future__ import annotations

import logging
import os
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes.aio import config as kube_config
from kubernetes.aio.client import ApiClient, Configuration

from ..backends.base import GangBackend, Kind
from ..core.trainer import TRAINER_GROUP
from .cache import Cache, Store
from .gangpods import SELECTOR, GangPods
from .informer import Informer, Resource
from .metered import MeteredApiClient

log = logging.getLogger("webhook.kube")

TRAINER = TRAINER_GROUP
TRAINJOBS = Resource(TRAINER, "v1alpha1", "trainjobs")
TRAINING_RUNTIMES = Resource(TRAINER, "v1alpha1", "trainingruntimes")
CLUSTER_RUNTIMES = Resource(TRAINER, "v1alpha1", "clustertrainingruntimes")
PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses")
JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets")
NODES = Resource("", "v1", "nodes")
PODS = Resource("", "v1", "pods")
POD_PAGE = 500
PODS_FORBIDDEN = (
    " (the service may not list and watch pods: gangs that lose pods after admission are not"
    " seen as degraded until it may; grant it as the chart does)"
)
NODE_PAGE = 500  # client-go's reflector lists in pages of 500 too
NODES_FORBIDDEN = (
    " (the service may not list and watch nodes: feasibility at admission stays off until it"
    " may; grant it, or run with --feasibility=off)"
)
POD_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def uses_pod_token(
    kubeconfig: str | None, environ: Mapping[str, str] | None = None, token: Path = POD_TOKEN
) -> bool:
    """Whether `connect` authenticates with the pod's ServiceAccount token: in a pod, unless a
    kubeconfig is named."""
    env = os.environ if environ is None else environ
    return not kubeconfig and bool(env.get("KUBERNETES_SERVICE_HOST")) and token.exists()


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
    elif uses_pod_token(kubeconfig, env):
        load_incluster: Any = kube_config.load_incluster_config
        load_incluster(client_configuration=cfg)
        source = "in-cluster"
    elif env.get("KUBECONFIG"):
        await load_file(config_file=env["KUBECONFIG"], client_configuration=cfg)
        source = env["KUBECONFIG"]
    else:
        log.warning("no cluster configured: serving with an empty cache")
        return None
    settle_proxy(cfg, env)
    log.info(
        "cluster configured",
        extra={
            "fields": {
                "source": source,
                "server": cfg.host,
                "proxy": shown_url(cfg.proxy) if cfg.proxy else "none",
            }
        },
    )
    return MeteredApiClient(configuration=cfg)  # (its requests counted once metrics exist)


def settle_proxy(cfg: Configuration, environ: Mapping[str, str]) -> None:
    """Decides once whether API requests go through a proxy, from the variables aiohttp would
    read (`HTTPS_PROXY`, `NO_PROXY`, ...; a kubeconfig's `proxy-url` wins), and turns aiohttp's
    `trust_env` off: with it on (kubernetes.aio's default) every request looks up `.netrc` and
    the proxy variables in a thread of its own, two thread hops per API call that tell nothing
    new (the service authenticates with a token or a certificate, never netrc)."""
    if not cfg.proxy:
        url = urllib.parse.urlsplit(cfg.host)
        proxies = _environment_proxies(environ)
        proxy = proxies.get(url.scheme)
        bypass: Any = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
        if proxy and urllib.parse.urlsplit(proxy).scheme in ("https", "wss"):
            # As aiohttp: it cannot talk TLS to a proxy, and ignored such a variable.
            log.warning(
                "an https:// proxy is not supported; connecting directly",
                extra={"fields": {"proxy": shown_url(proxy)}},
            )
        elif proxy and not bypass(url.hostname or "", proxies):
            cfg.proxy = proxy
    cfg.client_session_kwargs = {"trust_env": False}


def _environment_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """urllib's reading of the `*_proxy` variables: any case, then the lowercase ones again,
    which win (an empty lowercase one removes the uppercase one's proxy)."""
    proxies: dict[str, str] = {}
    for name, value in environ.items():
        if value and name.lower().endswith("_proxy"):
            proxies[name.lower().removesuffix("_proxy")] = value
    for name, value in environ.items():
        if name.endswith("_proxy"):
            if value:
                proxies[name.removesuffix("_proxy")] = value
            else:
                proxies.pop(name.removesuffix("_proxy"), None)
    return proxies


def shown_url(url: str) -> str:
    """A URL fit for a log line: without its user and password."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def resource(kind: Kind) -> Resource:
    return Resource(kind.group, kind.version, kind.plural)


def _per_namespace(
    api: ApiClient,
    resource: Resource,
    store: Store | GangPods,
    namespaces: Sequence[str],
    on_restart: Callable[[str], None] | None,
    **kw: Any,
) -> list[Informer]:
    """One informer for all namespaces, or one per watched namespace."""
    restart = (lambda: on_restart(resource.plural)) if on_restart else None
    if not namespaces:
        return [Informer(api, resource, store, on_restart=restart, **kw)]
    store.watched = tuple(namespaces)
    return [
        Informer(api, resource, store, namespace=ns, on_restart=restart, **kw) for ns in namespaces
    ]


def informers(
    api: ApiClient,
    cache: Cache,
    namespaces: Sequence[str] = (),
    on_restart: Callable[[str], None] | None = None,
) -> list[Informer]:
    """The webhooks' watches: TrainJobs and TrainingRuntimes (in `namespaces`, or everywhere),
    ClusterTrainingRuntimes, and PriorityClasses (admission checks the ones a gang names)."""
    return [
        *_per_namespace(api, TRAINJOBS, cache.trainjobs, namespaces, on_restart),
        *_per_namespace(api, TRAINING_RUNTIMES, cache.training_runtimes, namespaces, on_restart),
        *_per_namespace(api, CLUSTER_RUNTIMES, cache.cluster_runtimes, (), on_restart),
        *_per_namespace(api, PRIORITY_CLASSES, cache.priority_classes, (), on_restart),
    ]


def jobset_informers(
    api: ApiClient,
    cache: Cache,
    namespaces: Sequence[str] = (),
    on_restart: Callable[[str], None] | None = None,
) -> list[Informer]:
    """The JobSet watch (each kept trimmed to its owner and restart attempt), started once
    discovery serves JobSets (`jobsets.watch_jobsets`)."""
    return _per_namespace(api, JOBSETS, cache.jobsets, namespaces, on_restart)


def node_informer(
    api: ApiClient, cache: Cache, on_restart: Callable[[str], None] | None = None
) -> Informer:
    """The Node watch feasibility reads (in pages, each Node kept as its shape only)."""
    restart = (lambda: on_restart(NODES.plural)) if on_restart else None
    return Informer(
        api,
        NODES,
        cache.nodes,
        page_size=NODE_PAGE,
        not_served_hint="",
        forbidden_hint=NODES_FORBIDDEN,
        on_restart=restart,
    )


def kind_informers(
    api: ApiClient,
    cache: Cache,
    kind: Kind,
    namespaces: Sequence[str] = (),
    on_restart: Callable[[str], None] | None = None,
) -> list[Informer]:
    """The watches of one backend kind (started once discovery serves its API)."""
    hint = {"not_served_hint": f" ({kind.group_version} is not served)"}
    return _per_namespace(api, resource(kind), cache.store(kind), namespaces, on_restart, **hint)


def backend_informers(
    api: ApiClient,
    cache: Cache,
    backend: GangBackend,
    namespaces: Sequence[str] = (),
    on_restart: Callable[[str], None] | None = None,
) -> list[Informer]:
    """The watches of a backend's kinds that the cache knows to be served."""
    return [
        informer
        for kind in backend.kinds
        if cache.kind_served(kind)
        for informer in kind_informers(api, cache, kind, namespaces, on_restart)
    ]


def pod_informers(
    api: ApiClient,
    pods: GangPods,
    namespaces: Sequence[str] = (),
    on_restart: Callable[[str], None] | None = None,
) -> list[Informer]:
    """The watch of JobSet's pods (its label), in pages, each pod reduced to its Job's counts
    (`gangpods.py`): gang health after admission."""
    return _per_namespace(
        api, PODS, pods, namespaces, on_restart, page_size=POD_PAGE, label_selector=SELECTOR,
        not_served_hint="", forbidden_hint=PODS_FORBIDDEN,
    )  # fmt: skip
