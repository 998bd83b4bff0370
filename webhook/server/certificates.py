"""Where `serve` gets its serving certificate: files (`--cert-dir`, written by hand or by
cert-manager) or self-managed (a Secret this service keeps, its CA injected into the webhook
configurations; `kube/selfcerts.py`). `auto`, the default, is self-managed inside a cluster and
files elsewhere, so `make run` on a laptop keeps using `certs/`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.aio.client import ApiClient

from ..kube.selfcerts import SelfCertSettings, SelfManagedCerts
from ..metrics.registry import Metrics
from ..tls.certs import CA_CERT, TLS_CERT, TLS_KEY
from ..tls.policy import TlsPolicy
from ..tls.reload import ReloadingContext
from ..tls.selfmanaged import Policy

log = logging.getLogger("webhook.serve")
MODES = ("auto", "self", "files")
TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


@dataclass(frozen=True)
class CertSettings:
    mode: str = "files"  # files, self, or auto (the command line's default)
    secret_name: str = "trainjob-scheduling-webhook-cert"
    secret_namespace: str = ""  # empty: the service's own namespace
    service: str = "trainjob-scheduling-webhook"  # the Service in front of the webhooks
    mutating: str = "trainjob-scheduling-webhook"  # webhook configurations ("": none)
    validating: str = "trainjob-scheduling-webhook"
    check_period: float = 3600.0


def in_cluster(environ: Mapping[str, str] | None = None, token: Path = TOKEN) -> bool:
    """Running in a pod: as `kube.client.connect` tells (the service account is mounted)."""
    env = os.environ if environ is None else environ
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and token.exists()


def resolve(mode: str, environ: Mapping[str, str] | None = None, token: Path = TOKEN) -> str:
    if mode not in MODES:
        raise ValueError(f"--cert-management must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "auto":
        return "self" if in_cluster(environ, token) else "files"
    return mode


@dataclass
class Certificates:
    tls: ReloadingContext
    checks: dict[str, Callable[[], bool]] = field(default_factory=dict)  # readiness, besides tls
    jobs: list[Coroutine[Any, Any, None]] = field(default_factory=list)
    directory: Path | None = None  # ours, removed by close()

    def close(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def certificates(
    cert_dir: Path,
    settings: CertSettings,
    api: ApiClient | None,
    namespace: str,
    metrics: Metrics,
    tls_policy: TlsPolicy | None = None,
) -> Certificates:
    """The served certificate's source; raises ValueError (a startup error) on bad settings.
    `namespace` is the service's own (its Service's, and by default its Secret's)."""
    mode = resolve(settings.mode)
    if mode == "files":
        tls = ReloadingContext(
            cert_dir / TLS_CERT, cert_dir / TLS_KEY, metrics, cert_dir / CA_CERT, policy=tls_policy
        )
        tls.reload()
        return Certificates(tls)
    if api is None:
        raise ValueError(
            "--cert-management=self keeps the certificate in a Secret, so it needs a cluster "
            "(--kubeconfig, or run in one); use --cert-management=files with --cert-dir"
        )
    policy = Policy(settings.service, namespace)
    self_settings = SelfCertSettings(
        settings.secret_name,
        settings.secret_namespace or namespace,
        settings.mutating,
        settings.validating,
        settings.check_period,
    )
    # The container's only writable place is /tmp (an emptyDir); the CA key is never written.
    directory = Path(tempfile.mkdtemp(prefix="webhook-certs-"))
    tls = ReloadingContext(
        directory / TLS_CERT,
        directory / TLS_KEY,
        metrics,
        directory / CA_CERT,
        missing_ok=True,
        policy=tls_policy,
    )
    manager = SelfManagedCerts(api, self_settings, policy, tls, directory)
    log.info(
        "certificates are self-managed",
        extra={
            "fields": {
                "secret": f"{self_settings.namespace}/{self_settings.secret}",
                "dns_names": list(policy.dns_names),
                "mutating": settings.mutating,
                "validating": settings.validating,
            }
        },
    )
    return Certificates(
        tls, {"ca-bundle": lambda: manager.bundle_ready}, [manager.run()], directory
    )
