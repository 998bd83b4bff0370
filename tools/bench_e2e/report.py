"""The bench's figures as Markdown (the tables docs/architecture/benchmarks.md takes)."""

from __future__ import annotations

import math
from typing import Any

GOAL = 2.0  # seconds of excess per scenario (issue 36)
WHAT = {
    "baseline": "undisturbed: a TrainJob created",
    "resume": "resume, the suspended run's pods Terminating (30 s grace, SIGTERM ignored)",
    "failover": "leader killed, the reconciler away until the Lease expires (15 s)",
    "outage": "every replica down 30 s, the TrainJob created meanwhile",
    "restart": "a pod fails, JobSet restarts the attempt",
    "reapply": "deleted and created again under its name at once",
}


def _s(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.2f}"


def _ms(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value * 1000:.1f}"


def _n(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.0f}"


def _counts(found: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(found.items())) or "0"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# bench-e2e",
        "",
        f"{report.get('date')}, commit {report.get('commit')}, {report.get('host')}; "
        f"{report.get('seconds', 0):.0f} s in all.",
        "",
        f"Server: {report.get('server', '-')}",
        "",
    ]
    a = report.get("part_a")
    if a:
        base = a.get("baseline_p50", math.nan)
        lines += [
            "## A: a gang after a disturbance (issue 36)",
            "",
            "S: the gang's pods could first be created (its Jobs there and not suspended; the "
            "service or reconciler back). T: its last pod bound. L = T - S. Excess = L - "
            f"the baseline's median L ({_s(base)} s). Goal: excess at most {GOAL:.0f} s. "
            "p99 is nearest-rank (the largest of fewer than 100 rounds).",
            "",
            "| Scenario | rounds (failed) | L p50 / p99 (s) | excess p50 / p99 (s) | "
            "S after the disturbance p50 (s) | kube-scheduler's part p50 (s) | holds a round "
            "p50 / max | wakes a round p50 / max | FailedCreate a round p50 / max | goal |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, fig in a["scenarios"].items():
            excess = fig["excess"]
            goal = "-"
            if name != "baseline" and not math.isnan(excess["p99"]):
                goal = "met" if excess["p99"] <= GOAL else "**missed**"
            lines.append(
                f"| {name}: {WHAT.get(name, '')} | {fig['rounds']:.0f} ({fig['failed']}) | "
                f"{_s(fig['latency']['p50'])} / {_s(fig['latency']['p99'])} | "
                f"{_s(excess['p50'])} / {_s(excess['p99'])} | {_s(fig['start']['p50'])} | "
                f"{_s(fig['scheduler']['p50'])} | "
                f"{_n(fig['held_per_round']['p50'])} / {_n(fig['held_per_round']['max'])} | "
                f"{_n(fig['woken_per_round']['p50'])} / {_n(fig['woken_per_round']['max'])} | "
                f"{_n(fig['failed_creates_per_round']['p50'])} / "
                f"{_n(fig['failed_creates_per_round']['max'])} | {goal} |"
            )
        lines += [
            "",
            "| Scenario | holds by reason (all rounds) | wakes by reason | untied |",
            "|---|---|---|---|",
        ]
        for name, fig in a["scenarios"].items():
            lines.append(
                f"| {name} | {_counts(fig['held_by_reason'])} | "
                f"{_counts(fig['woken_by_reason'])} | {fig['untied']:.0f} |"
            )
        lines += [
            "",
            "Rounds (seconds after the disturbance):",
            "",
            "| scenario | round | S | first pod | last pod | gang | T | L | excess | notes |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in a.get("rounds", []):
            if not r["ok"]:
                lines.append(
                    f"| {r['scenario']} | {r['round']} | failed: {r['error'][:200]} | | | | | | | |"
                )
                continue
            lines.append(
                f"| {r['scenario']} | {r['round']} | {_s(r['start'])} | {_s(r['first_pod'])} | "
                f"{_s(r['last_pod'])} | {_s(r['gang_ready'])} | {_s(r['bound'])} | "
                f"{_s(r['latency'])} | {_s(r['excess'])} | {r['notes'] or ''} |"
            )
        if a.get("notes"):
            lines += ["", *[f"* {n}" for n in a["notes"]]]
        lines.append("")
    b = report.get("part_b")
    if b:
        lines += [
            "## B: scale (issue 37)",
            "",
            "| N | rate /s | settled after (s) | RSS idle / settled / peak (MiB) | RSS per "
            "TrainJob (KiB) | CPU (s) / per TrainJob (ms) | TrainJob->PodGroup p50 / p99 (s) | "
            "TrainJob->bound p50 / p99 (s) | pod review p50 / p99 (ms), logged | service "
            "histogram p50 / p99 (ms) | API server p50 / p99 (ms) |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for x in b["sizes"]:
            lines.append(
                f"| {x['n']} | {x['rate']:.0f} | {x['seconds_to_settle']:.0f} | "
                f"{x['rss_idle_mib']:.1f} / {x['rss_settled_mib']:.1f} / {x['rss_peak_mib']:.1f} | "
                f"{x['rss_per_trainjob_kib']:.1f} | {x['cpu_seconds']:.1f} / "
                f"{x['cpu_ms_per_trainjob']:.1f} | {_s(x['trainjob_to_podgroup']['p50'])} / "
                f"{_s(x['trainjob_to_podgroup']['p99'])} | {_s(x['trainjob_to_bound']['p50'])} / "
                f"{_s(x['trainjob_to_bound']['p99'])} | {_ms(x['pod_reviews_logged']['p50'])} / "
                f"{_ms(x['pod_reviews_logged']['p99'])} ({x['pod_reviews_logged']['n']:.0f}) | "
                f"{_ms(x['pod_review_service_histogram']['p50'])} / "
                f"{_ms(x['pod_review_service_histogram']['p99'])} | "
                f"{_ms(x['pod_review_apiserver_histogram']['p50'])} / "
                f"{_ms(x['pod_review_apiserver_histogram']['p99'])} |"
            )
        lines += ["", "CPU seconds of the other processes meanwhile:", ""]
        for x in b["sizes"]:
            others = ", ".join(f"{k} {v:.0f}" for k, v in sorted(x["others_cpu_seconds"].items()))
            lines.append(f"* N={x['n']}: {others}")
        g = b.get("growth") or {}
        if g:
            lines += [
                "",
                f"Growth from N={g['from'][0]} to N={g['from'][1]}, carried to 10,000: RSS "
                f"{g['rss_kib_per_trainjob']:.1f} KiB per TrainJob settled "
                f"({g['rss_settled_at_10000_mib']:.0f} MiB at 10,000), "
                f"{g['peak_rss_kib_per_trainjob']:.1f} KiB at the peak "
                f"({g['rss_peak_at_10000_mib']:.0f} MiB); CPU {g['cpu_ms_per_trainjob']:.1f} ms "
                f"per TrainJob ({g['cpu_seconds_at_10000']:.0f} s for 10,000); TrainJob->PodGroup "
                f"p99 ~ N^{_s(g['trainjob_to_podgroup_p99_exponent'])} "
                f"({_s(g['trainjob_to_podgroup_p99_at_10000'])} s at 10,000 at the same rate); "
                f"pod review p99 ~ N^{_s(g['pod_reviews_logged_p99_exponent'])} "
                f"({_ms(g['pod_reviews_logged_p99_at_10000'])} ms).",
            ]
        lines.append("")
    return "\n".join(lines)
