"""`serve` options: each from its flag, else $WEBHOOK_<NAME>, else the --config file, else the
default; bad values of any source are usage errors (exit 2), never a crash."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from webhook.cli import UsageError, build_parser, load_config


def serve_args(argv: list[str], config: dict[str, object] | None = None) -> argparse.Namespace:
    return build_parser(config or {}).parse_args(["serve", *argv])


def test_defaults_are_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    args = serve_args([])
    assert (args.port, args.health_port, args.metrics_port) == (9443, 8081, 8443)
    assert args.metrics_auth is True and args.reconcile is True and args.leader_elect is True
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (15.0, 10.0, 2.0)
    assert (args.workers, args.qps, args.burst) == (4, 20.0, 30)
    assert (args.gang_qps, args.gang_burst) == (100.0, 200)
    assert args.watch_namespaces == () and args.namespace == ""
    assert (args.metrics_token_ttl, args.metrics_allow_ttl, args.metrics_deny_ttl) == (60, 300, 30)
    assert (args.connection_max_requests, args.connection_max_age) == (1000, 30.0)


def test_connection_bounds_take_zero_and_refuse_negatives() -> None:
    args = serve_args(["--connection-max-requests=0", "--connection-max-age=0"])
    assert (args.connection_max_requests, args.connection_max_age) == (0, 0.0)
    for bad in (["--connection-max-requests=-1"], ["--connection-max-requests=1.5"],
                ["--connection-max-age=-2"]):  # fmt: skip
        with pytest.raises(SystemExit):
            serve_args(bad)


def test_flag_beats_environment_beats_file_beats_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "workers: 8\nqps: 50\nwatch-namespaces: [team-a, team-b]\nleader_elect: false\n"
    )
    loaded = load_config(["serve", "--config", str(config)])
    monkeypatch.setenv("WEBHOOK_QPS", "70")
    args = serve_args(["--config", str(config), "--workers", "2"], loaded)
    assert args.workers == 2  # flag
    assert args.qps == 70.0  # environment over file
    assert args.watch_namespaces == ("team-a", "team-b")  # file (a YAML list)
    assert args.leader_elect is False  # file, underscores accepted
    assert args.burst == 30  # default


def test_switches_take_true_false_and_a_bare_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    assert serve_args(["--reconcile=false"]).reconcile is False
    assert serve_args(["--metrics-auth", "off"]).metrics_auth is False
    assert serve_args(["--leader-elect"]).leader_elect is True
    monkeypatch.setenv("WEBHOOK_RECONCILE", "no")
    assert serve_args([]).reconcile is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workers: 2\nbogus: 1\n", "unknown options: bogus"),
        ("- a list\n", "must be a mapping"),
        ("workers: [\n", "not valid YAML"),
    ],
)
def test_a_bad_config_file_is_a_usage_error(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_config(["serve", f"--config={config}"])
    with pytest.raises(UsageError, match="cannot read"):
        load_config(["serve", "--config", str(tmp_path / "missing.yaml")])


@pytest.mark.parametrize(
    ("env", "value"),
    [("WEBHOOK_RECONCILE", "maybe"), ("WEBHOOK_WORKERS", "0"), ("WEBHOOK_QPS", "fast")],
)
def test_a_bad_value_exits_2_with_a_message(env: str, value: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", "--cert-dir", str(tmp_path)],
        env={"PATH": "/usr/bin:/bin", env: value},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "invalid" in proc.stderr and value in proc.stderr


def test_a_bad_config_file_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("lease-duration: 15\nrenew_deadlin: 10\n")
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "unknown options: renew-deadlin" in proc.stderr


def test_inconsistent_leader_election_durations_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", "--renew-deadline", "20"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "leader election" in proc.stderr and "renew" in proc.stderr


def test_the_api_proxy_is_settled_once_from_the_environment() -> None:
    """aiohttp's per-request netrc and proxy lookups (a thread each) are off; the proxy the
    same variables name is used, lowercase first, NO_PROXY respected, a kubeconfig's kept."""
    from kubernetes.aio.client import Configuration

    from webhook.kube.client import settle_proxy, shown_url

    def proxy(env: dict[str, str], kubeconfig_proxy: str | None = None) -> str | None:
        cfg = Configuration(host="https://10.0.0.1:443")
        cfg.proxy = kubeconfig_proxy
        settle_proxy(cfg, env)
        assert cfg.client_session_kwargs == {"trust_env": False}
        found: str | None = cfg.proxy
        return found

    assert proxy({}) is None
    assert proxy({"HTTPS_PROXY": "http://p:3128"}) == "http://p:3128"
    assert proxy({"HTTP_PROXY": "http://p:3128"}) is None  # not for an https server
    assert proxy({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "10.0.0.1,.svc"}) is None
    assert proxy({"HTTPS_PROXY": "http://up:1", "https_proxy": "http://low:1"}) == "http://low:1"
    assert proxy({"HTTPS_PROXY": "http://p:3128"}, "http://kube:1") == "http://kube:1"
    assert proxy({"HTTPS_PROXY": "http://up:1", "https_proxy": ""}) is None  # urllib's rule
    assert proxy({"HTTPS_PROXY": "https://p:3129"}) is None  # aiohttp ignored these too
    # A proxy's password never reaches a log line.
    assert shown_url("http://user:secret@p:3128/x") == "http://p:3128/x"
    assert shown_url("http://p:3128") == "http://p:3128"
