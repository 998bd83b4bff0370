"""`make e2e-matrix`: `make e2e` on each configuration of the harness's control plane, one after
the other, the harness put back to the default configuration at the end (also after a failure).

    python -m tools.e2e_matrix [--configs a,b,c,d] [--results FILE] [--harness DIR]

The configurations (settings of the harness's up.sh):

* a: the default, every alpha gate on (GenericWorkload, GangScheduling,
  WorkloadAwarePreemption, TopologyAwareWorkloadScheduling);
* b: FEATURE_GATES=GenericWorkload=true,GangScheduling=true, as most users run it (the API
  server drops the gated PodGroup fields);
* c: b plus WorkloadWithJob=true (the Job controller's own gang for Indexed Jobs);
* d: K8S=1.36, pristine 1.36.2 (scheduling.k8s.io/v1alpha2 only).

Switching is `down.sh`, then `up.sh` with the configuration's settings (MIRROR_DIR, NODE and
PROJECT_CHECKOUT from the environment, defaults /work/.mirror, 1 and this checkout). For each it
appends a row to the results file (Markdown): the checkout's commit and its date, the
configuration, passed / failed / skipped / errors (from pytest's JUnit XML), the wall time and
the log file (the service's own log is kept beside it, under tmp-<configuration>/). The tests
learn the configuration from the server itself, never from here.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("HARNESS_SCRIPTS", "/work/shared/harness"))

CONFIGS: dict[str, tuple[str, dict[str, str]]] = {
    "a": ("default (all alpha gates on)", {}),
    "b": ("gates off: GenericWorkload+GangScheduling",
          {"FEATURE_GATES": "GenericWorkload=true,GangScheduling=true"}),
    "c": ("gates off + WorkloadWithJob",
          {"FEATURE_GATES": "GenericWorkload=true,GangScheduling=true,WorkloadWithJob=true"}),
    "d": ("1.36.2 (v1alpha2)", {"K8S": "1.36"}),
}  # fmt: skip
DEFAULT = "a"
# Knobs of up.sh that a configuration sets; cleared for the others so the shell's own values
# never leak into a configuration that does not name them.
KNOBS = ("FEATURE_GATES", "K8S", "RUNTIME_CONFIG", "BIN_DIR", "DATA_DIR")


@dataclass
class Outcome:
    config: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    seconds: float = 0.0
    log: str = ""
    note: str = ""
    started: str = ""  # UTC, when its suite started
    commit: str = ""  # the checkout's commit then (and whether it had changes)
    commit_date: str = ""


def harness_env(settings: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KNOBS}
    env.setdefault("MIRROR_DIR", "/work/.mirror")
    env.setdefault("NODE", "1")
    env.setdefault("PROJECT_CHECKOUT", str(REPO))
    env.update(settings)
    return env


def switch(config: str, log: Path) -> None:
    """down.sh, then up.sh with the configuration's settings; raises when up.sh fails."""
    _, settings = CONFIGS[config]
    env = harness_env(settings)
    with open(log, "ab") as out:
        out.write(f"\n=== switching the harness to ({config}) {settings}\n".encode())
        out.flush()
        subprocess.run([str(SHARED / "down.sh")], env=env, stdout=out, stderr=out, check=False)
        subprocess.run([str(SHARED / "up.sh")], env=env, stdout=out, stderr=out, check=True)


def count(junit: Path) -> tuple[int, int, int, int]:
    """(passed, failed, skipped, errors) of a pytest JUnit XML report."""
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = failed = skipped = errors = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0))
        skipped += int(suite.get("skipped", 0))
        errors += int(suite.get("errors", 0))
    return tests - failed - skipped - errors, failed, skipped, errors


def run_suite(config: str, workdir: Path, kubeconfig: str) -> Outcome:
    log = workdir / f"e2e-{config}.log"
    junit = workdir / f"e2e-{config}.xml"
    sha, date = commit()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("E2E_KUBECONFIG", "KUBECONFIG")}
    env["E2E_KUBECONFIG"] = kubeconfig
    with open(log, "wb") as out:
        subprocess.run(
            ["make", "--no-print-directory", "e2e",
             f"E2E_ARGS=--junitxml={junit} --basetemp={workdir / f'tmp-{config}'}"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    outcome = Outcome(config, seconds=time.monotonic() - started, log=str(log), started=when,
                      commit=sha, commit_date=date)  # fmt: skip
    if junit.exists():
        outcome.passed, outcome.failed, outcome.skipped, outcome.errors = count(junit)
    else:
        outcome.note = "no JUnit report (the run did not start: see the log)"
    return outcome


def commit() -> tuple[str, str]:
    """The checkout's commit (marked when the working tree has changes) and its date."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip()

    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return (git("rev-parse", "--short", "HEAD") or "unknown") + dirty, git(
        "log", "-1", "--format=%cI"
    )


def append(results: Path, outcomes: list[Outcome]) -> None:
    new = not results.exists()
    results.parent.mkdir(parents=True, exist_ok=True)
    with open(results, "a") as out:
        if new:
            out.write(
                "# make e2e on each harness configuration\n\n"
                "| started | commit | commit date | configuration | passed | failed | skipped "
                "| errors | wall time | log |\n|---|---|---|---|---|---|---|---|---|---|\n"
            )
        for o in outcomes:
            name, _ = CONFIGS[o.config]
            out.write(
                f"| {o.started or '-'} | {o.commit or '-'} | {o.commit_date or '-'} "
                f"| ({o.config}) {name} | {o.passed} | {o.failed} | {o.skipped} | {o.errors} "
                f"| {o.seconds / 60:.1f} min | {o.log}{' ' + o.note if o.note else ''} |\n"
            )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.e2e_matrix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--configs", default="a,b,c,d", help="comma-separated, of a, b, c, d")
    parser.add_argument("--results", default="build/e2e-matrix-results.md", type=Path)
    parser.add_argument(
        "--harness", default=os.environ.get("HARNESS_DIR", str(Path.home() / "harness"))
    )
    parser.add_argument("--workdir", default=None, type=Path, help="logs (default: a temp dir)")
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configurations {unknown}: choose from {', '.join(CONFIGS)}")
    workdir = (
        args.workdir
        or Path(os.environ.get("TMPDIR", "/tmp")) / f"e2e-matrix-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = str(Path(args.harness) / "kubeconfig")
    harness_log = workdir / "harness.log"
    outcomes: list[Outcome] = []
    current: str | None = None  # the configuration the harness is in, when known
    try:
        for config in configs:
            print(f"e2e-matrix: ({config}) {CONFIGS[config][0]}: switching the harness "
                  f"(log {harness_log})", flush=True)  # fmt: skip
            current = None
            try:
                switch(config, harness_log)
            except subprocess.CalledProcessError:
                outcomes.append(Outcome(config, log=str(harness_log), note="up.sh failed"))
                continue
            current = config
            outcome = run_suite(config, workdir, kubeconfig)
            outcomes.append(outcome)
            print(f"e2e-matrix: ({config}) passed {outcome.passed}, failed {outcome.failed}, "
                  f"skipped {outcome.skipped}, errors {outcome.errors} in "
                  f"{outcome.seconds / 60:.1f} min (log {outcome.log})", flush=True)  # fmt: skip
    finally:
        if current != DEFAULT:
            print(f"e2e-matrix: putting the harness back to ({DEFAULT})", flush=True)
            try:
                switch(DEFAULT, harness_log)
            except subprocess.CalledProcessError:
                print(
                    f"e2e-matrix: up.sh failed for ({DEFAULT}): see {harness_log}", file=sys.stderr
                )
        append(args.results, outcomes)
        print(f"e2e-matrix: results appended to {args.results}")
    return 0 if all(o.failed == 0 and o.errors == 0 and not o.note for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
