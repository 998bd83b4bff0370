"""`python -m webhook <command>`: the service's one entry point."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from .backends.base import GangBackend
from .core import errors as fe
from .core.errors import Path
from .core.fields import parse
from .core.trainer import NAMESPACED_RUNTIME_KIND, RUNTIME_KINDS, Runtime, TrainJob
from .core.validation import Verdict, check_trainjob, runtime_layout

EXIT_INVALID = 1
EXIT_USAGE = 2


class UsageError(Exception):
    pass


def _load(paths: Sequence[str]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") if path != "-" else sys.stdin as handle:
                found = [d for d in yaml.safe_load_all(handle) if d is not None]
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise UsageError(f"{path} is not valid YAML: {exc}") from exc
        for doc in found:
            if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
                raise UsageError(f"{path}: every document must be a Kubernetes object with a kind")
            docs.append(doc)
    return docs


def _name(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, dict) else ""


def _report(kind: str, name: str, verdict: Verdict, err: TextIO) -> bool:
    for warning in verdict.warnings:
        print(f"Warning: {warning}", file=err)
    if verdict.errors:
        print(f'error: {kind} "{name}" is invalid:', file=err)
        for error in verdict.errors:
            print(f"  * {error}", file=err)
    return verdict.allowed


RuntimeKey = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name


def _runtime_key(kind: str, namespace: str | None, name: str | None) -> RuntimeKey:
    ns = (namespace or "default") if kind == NAMESPACED_RUNTIME_KIND else ""
    return (kind, ns, name or "")


def plan_command(paths: Sequence[str], out: TextIO, err: TextIO) -> int:
    """Prints the objects each TrainJob in the files would get; field errors exit non-zero."""
    from .backends.native import NativeBackend  # the Kubernetes client is slow to import
    from .core.plan import build_plan

    backend: GangBackend = NativeBackend()
    docs = _load(paths)
    unknown = {d["kind"] for d in docs} - {"TrainJob", *RUNTIME_KINDS}
    if unknown:
        raise UsageError(f"unexpected kinds {sorted(unknown)}: give TrainJobs and runtimes")
    ok = True
    runtimes: dict[RuntimeKey, Runtime] = {}
    unreadable: set[RuntimeKey] = set()
    for doc in (d for d in docs if d["kind"] in RUNTIME_KINDS):
        runtime, errs = parse(Runtime, doc)
        verdict = Verdict(tuple(errs)) if runtime is None else runtime_layout(runtime)[1]
        ok = _report(doc["kind"], _name(doc), verdict, err) and ok
        meta = doc.get("metadata")
        namespace = meta.get("namespace") if isinstance(meta, dict) else None
        key = _runtime_key(doc["kind"], namespace, _name(doc))
        if runtime is None:
            unreadable.add(key)
        else:  # kept when invalid, so its TrainJobs say why
            runtimes[key] = runtime

    rendered: list[dict[str, Any]] = []
    for doc in (d for d in docs if d["kind"] == "TrainJob"):
        trainjob, errs = parse(TrainJob, doc)
        if trainjob is None:
            _report("TrainJob", _name(doc), Verdict(tuple(errs)), err)
            ok = False
            continue
        ref = trainjob.spec.runtime_ref
        key = _runtime_key(trainjob.runtime_kind, trainjob.namespace, ref.name)
        if key in unreadable:
            detail = f"the {key[0]} in the given files is invalid (see above); fix it first"
            error = fe.invalid(Path("spec", "runtimeRef", "name"), ref.name, detail)
            _report("TrainJob", _name(doc), Verdict((error,)), err)
            ok = False
            continue
        runtime = runtimes.get(key)
        # Runtime warnings were printed with the runtime already.
        if not _report(
            "TrainJob", _name(doc), Verdict(check_trainjob(trainjob, runtime).errors), err
        ):
            ok = False
            continue
        assert runtime is not None
        plan = build_plan(trainjob, runtime)
        if plan is None:
            print(
                f"Note: TrainJob {_name(doc)!r}: its runtime has no spec.scheduling, so it gets "
                "no Workload and no PodGroups",
                file=err,
            )
            continue
        rendered += backend.render(plan)
    if rendered:
        out.write(yaml.safe_dump_all(rendered, sort_keys=False))
    return 0 if ok else EXIT_INVALID


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m webhook",
        description="Workload-aware scheduling for Kubeflow TrainJobs.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser(
        "plan",
        help="print the Workload and PodGroups a TrainJob would get",
        description="Print, as YAML, the Workload and PodGroups each TrainJob in the files would "
        "get from its runtime (also in the files); warnings and field errors go to stderr.",
    )
    plan.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML file with TrainJobs and (Cluster)TrainingRuntimes; repeatable; - for stdin",
    )
    _add_serve(commands)
    _add_certs(commands)
    return parser


def _env(name: str, default: str) -> str:
    return os.environ.get(f"WEBHOOK_{name}", default)


def _port(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(text)
    return port


def _positive(kind: type[int] | type[float]) -> Any:
    def convert(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise ValueError(text)
        return value

    convert.__name__ = f"positive {kind.__name__}"  # argparse names it in its error message
    return convert


def _at_least_zero(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(text)
    return value


_port.__name__ = "port (1-65535)"
_at_least_zero.__name__ = "number >= 0"


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve the admission webhooks over TLS",
        description="Serve the admission webhooks over TLS, with health probes over plain HTTP. "
        "Every flag can also be set by the environment variable shown.",
    )
    opts: list[tuple[str, str, Any, str, str]] = [
        ("--host", "HOST", str, "0.0.0.0", "address to listen on"),
        ("--port", "PORT", _port, "9443", "webhook (TLS) port"),
        ("--health-port", "HEALTH_PORT", _port, "8081", "plain-HTTP port for /healthz and /readyz"),
        ("--cert-dir", "CERT_DIR", str, "certs", "directory holding tls.crt and tls.key"),
        ("--kubeconfig", "KUBECONFIG", str, "", "kubeconfig file (default: in-cluster, "
         "else $KUBECONFIG, else no cluster)"),
        ("--cert-poll-seconds", "CERT_POLL_SECONDS", _positive(float), "5",
         "how often tls.* are re-read"),
        ("--shutdown-delay", "SHUTDOWN_DELAY", _at_least_zero, "0",
         "seconds to keep serving, not ready, after SIGTERM (endpoint removal)"),
        ("--shutdown-timeout", "SHUTDOWN_TIMEOUT", _positive(float), "25",
         "seconds in-flight reviews get to finish on SIGTERM"),
        ("--max-body-bytes", "MAX_BODY_BYTES", _positive(int), str(6 * 1024 * 1024),
         "larger AdmissionReview bodies get 413"),
        ("--header-timeout", "HEADER_TIMEOUT", _positive(float), "10",
         "seconds a request's headers may take (slow clients get 408)"),
        ("--body-timeout", "BODY_TIMEOUT", _positive(float), "10",
         "seconds a request's body may take (slow clients get 408)"),
    ]  # fmt: skip
    # String defaults go through `type` too, so a bad environment value is a usage error.
    for flag, env, kind, default, text in opts:
        serve.add_argument(
            flag, type=kind, default=_env(env, default), help=f"{text} [$WEBHOOK_{env}]"
        )
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        type=str.lower,
        default=_env("LOG_LEVEL", "info").lower(),
        help="[$WEBHOOK_LOG_LEVEL]",
    )


def _add_certs(commands: Any) -> None:
    certs = commands.add_parser(
        "certs",
        help="write a development CA and serving certificate",
        description="Write ca.crt, ca.key, tls.crt and tls.key (a throwaway CA and a serving "
        "certificate for localhost, 127.0.0.1 and <service>.<namespace>.svc).",
    )
    certs.add_argument("--out", default="certs", help="output directory (default: certs)")
    certs.add_argument("--service", default="trainjob-scheduling-webhook")
    certs.add_argument("--namespace", default="trainjob-scheduling-system")
    certs.add_argument("--dns", action="append", default=[], help="extra DNS name; repeatable")
    certs.add_argument("--ip", action="append", default=[], help="extra IP address; repeatable")
    certs.add_argument("--days", type=int, default=365)


def serve_command(args: argparse.Namespace) -> int:
    from .server import logs
    from .server.app import Limits
    from .server.run import Settings, StartupError, serve

    logs.configure(args.log_level)
    settings = Settings(
        host=args.host,
        port=args.port,
        health_port=args.health_port,
        cert_dir=pathlib.Path(args.cert_dir),
        kubeconfig=args.kubeconfig or None,
        cert_poll_seconds=args.cert_poll_seconds,
        shutdown_timeout=args.shutdown_timeout,
        shutdown_delay=args.shutdown_delay,
        header_timeout=args.header_timeout,
        limits=Limits(max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout),
    )
    try:
        import uvloop

        run: Any = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        run(serve(settings))
    except StartupError as err:
        logging.getLogger("webhook.serve").error(str(err))
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def certs_command(args: argparse.Namespace, out: TextIO) -> int:
    from .tls.certs import CertSpec, issue, write

    try:
        spec = CertSpec(args.service, args.namespace, tuple(args.dns), tuple(args.ip), args.days)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    paths = write(issue(spec), pathlib.Path(args.out))
    for path in paths.values():
        print(f"wrote {path}", file=out)
    print(f"serving certificate names: {', '.join(spec.dns_names + spec.ip_addresses)}", file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "plan":
            return plan_command(args.files, sys.stdout, sys.stderr)
        if args.command == "serve":
            return serve_command(args)
        if args.command == "certs":
            return certs_command(args, sys.stdout)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE
