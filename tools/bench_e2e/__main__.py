"""`python -m tools.bench_e2e [--part a,b] [--rounds 6] [--sizes 100,1000] ...`: runs the
bench against the cluster of `--kubeconfig` (else $KUBECONFIG, else the harness's), prints the
figures and writes them to `<out>/bench-e2e.json` and `<out>/bench-e2e.md`. On the shared
harness run it under its lock: `flock /tmp/harness.lock make bench-e2e`."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.e2e.cluster import Skip
from tools.e2e_matrix import commit

from .gangs import SCENARIOS, run_part_a
from .report import markdown
from .scale import growth, run_size
from .session import configure, host, session


def parse(argv: list[str]) -> argparse.Namespace:
    harness = Path.home() / "harness" / "kubeconfig"
    default = os.environ.get("KUBECONFIG") or (str(harness) if harness.exists() else "")
    p = argparse.ArgumentParser(prog="python -m tools.bench_e2e", description=__doc__)
    p.add_argument("--kubeconfig", default=default, help="the cluster (default: %(default)s)")
    p.add_argument("--part", default="a,b", help="a (gangs after disturbances), b (scale), or both")
    p.add_argument("--rounds", type=int, default=6, help="rounds of each part-A scenario")
    p.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="part-A scenarios (baseline is always run)"
    )
    p.add_argument("--sizes", default="100,1000", help="part-B TrainJob counts")
    p.add_argument("--rate", type=float, default=10.0, help="part-B TrainJobs created per second")
    p.add_argument("--namespaces", type=int, default=4, help="part-B namespaces")
    p.add_argument("--out", default="build", help="where the report goes")
    p.add_argument(
        "--workdir",
        default="",
        help="the services' logs and certificates (default: <out>/bench-e2e-work)",
    )
    return p.parse_args(argv)


def log(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if not args.kubeconfig:
        print(
            "error: no cluster: pass --kubeconfig, set KUBECONFIG or start the harness",
            file=sys.stderr,
        )
        return 2
    configure(args.kubeconfig)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir) if args.workdir else out / "bench-e2e-work"
    parts = {p.strip().lower() for p in args.part.split(",") if p.strip()}
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit()[0],
        "host": host(),
        "kubeconfig": args.kubeconfig,
        "arguments": vars(args),
    }
    began = time.monotonic()
    try:
        if "a" in parts:
            scenarios = tuple(
                dict.fromkeys(
                    ["baseline", *[x.strip() for x in args.scenarios.split(",") if x.strip()]]
                )
            )
            unknown = set(scenarios) - set(SCENARIOS)
            if unknown:
                print(f"error: unknown scenarios {sorted(unknown)}", file=sys.stderr)
                return 2
            log(f"part A: {', '.join(scenarios)}, {args.rounds} rounds each")
            with session(list(SCENARIOS), workdir / "gangs", replicas=2, lease_key="failover") as s:
                report["server"] = f"{s.cluster.server} ({s.cluster.version}): {s.facts.describe()}"
                report["part_a"] = run_part_a(s, args.rounds, scenarios, log)
                report["part_a"]["notes"] = s.notes
                report["part_a"]["front"] = {
                    "connections": s.front.connections if s.front else 0,
                    "refused": s.front.refused if s.front else 0,
                }
        if "b" in parts:
            sizes = []
            for n in (int(x) for x in args.sizes.split(",") if x.strip()):
                log(f"part B: N={n}")
                sizes.append(run_size(n, args.rate, workdir, args.namespaces, log))
            report["part_b"] = {"sizes": sizes, "growth": growth(sizes)}
    except Skip as why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    finally:
        report["seconds"] = round(time.monotonic() - began, 1)
        (out / "bench-e2e.json").write_text(json.dumps(_clean(report), indent=1, default=str))
        text = markdown(report)
        (out / "bench-e2e.md").write_text(text)
        print(text)
        print(f"written: {out / 'bench-e2e.md'}, {out / 'bench-e2e.json'}")
    return 0


def _clean(value: Any) -> Any:
    """NaN (no figure) as null: JSON has no NaN."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
