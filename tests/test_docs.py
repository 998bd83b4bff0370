"""The documentation's examples, run: every runtime and TrainJob in docs/ planned (to the gangs
its page says, or denied at the field its page shows), every chart values example validated
against values.schema.json, every local command checked against the Makefile and the CLI's
parser, every metric named in the docs in the registry; and the generated reference pages
complete (every Event reason and every label or annotation constant explained).

Markers, an HTML comment on the line before a fenced block:
  <!-- plan: gangs=basic,8 -->     each PodGroup of the plan, in `plan -o tree` order: its gang
                                   minCount, or `basic`
  <!-- plan: valid -->             runtimes alone: planned without an error
  <!-- expect-error: PATH -->      `plan` exits 1 naming the field PATH
  <!-- values -->                  chart values: valid against values.schema.json
  <!-- output -->                  a console session: each `$ python -m webhook ...` run, its
                                   output (stdout and stderr) exactly the lines shown, and
                                   `$ echo $?` its exit status
  <!-- not-runnable -->            shown, deliberately not run
A YAML block holding a runtime or TrainJob must carry one of them.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests import docs_reference as ref
from tests.paths import REPO
from webhook import cli

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
PLANNED_KINDS = {"TrainJob", "ClusterTrainingRuntime", "TrainingRuntime"}
_FENCE = re.compile(
    r"(?:<!-- (?P<marker>.*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```", re.M | re.S
)
CLI_PREFIXES = (
    ["python", "-m", "webhook"],
    [".venv/bin/python", "-m", "webhook"],
    ["trainjob-scheduling-webhook"],
    ["kubectl", "trainjob-scheduling"],
)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    marker: str
    body: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start("lang")) + 1
            found.append(Block(page, line, m["lang"], m["marker"] or "", m["body"]))
    return found


BLOCKS = blocks()
YAML = [b for b in BLOCKS if b.lang == "yaml"]


def kinds(block: Block) -> set[str]:
    try:
        docs = list(yaml.safe_load_all(block.body))
    except yaml.YAMLError:
        return set()
    return {str(d["kind"]) for d in docs if isinstance(d, dict) and "kind" in d}


PLANNED = [b for b in YAML if kinds(b) & PLANNED_KINDS]


def test_the_docs_have_examples_to_check() -> None:
    assert len(PLANNED) >= 5 and any(b.marker == "values" for b in YAML)


@pytest.mark.parametrize("block", PLANNED, ids=[b.id for b in PLANNED])
def test_runtime_and_trainjob_examples_plan_as_the_page_says(block: Block, tmp_path: Path) -> None:
    marker = block.marker
    assert marker.startswith(("plan:", "expect-error:", "not-runnable")), (
        f"{block.id}: a runtime or TrainJob example needs a marker (plan: gangs=..., "
        "plan: valid, expect-error: PATH or not-runnable)"
    )
    if marker == "not-runnable":
        return
    source = tmp_path / "example.yaml"
    source.write_text(block.body)
    out, err = io.StringIO(), io.StringIO()
    status = cli.plan_command([str(source)], out, err, output="tree")
    if marker.startswith("expect-error:"):
        path = marker.removeprefix("expect-error:").strip()
        assert status == cli.EXIT_INVALID, f"{block.id}: planned without an error"
        assert f"  * {path}: " in err.getvalue(), err.getvalue()
        return
    assert status == 0, err.getvalue()
    expected = marker.removeprefix("plan:").strip()
    if expected == "valid":
        return
    got = [
        m[1] or "basic"
        for m in re.finditer(r"\(PodGroup\) (?:gang minCount (\d+)|basic)", out.getvalue())
    ]
    assert f"gangs={','.join(got)}" == expected, out.getvalue()


VALUES = [b for b in YAML if b.marker == "values"]


@pytest.mark.parametrize("block", VALUES, ids=[b.id for b in VALUES])
def test_chart_values_examples_are_valid(block: Block) -> None:
    schema = json.loads((ref.CHART / "values.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(block.body), schema)


def helm_sets() -> list[tuple[str, dict[str, object]]]:
    """(where, values) of every `helm install`/`helm upgrade` shown with `--set`s, in the docs,
    the README and the chart's README: the values those `--set`s give, typed as Helm types
    them (true/false, integers)."""
    found = []
    sources = [*PAGES, REPO / "README.md", ref.CHART / "README.md"]
    for source in sources:
        text = source.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if not re.match(r"\s*helm (install|upgrade) ", line) or "--set" not in line:
                continue
            values: dict[str, object] = {}
            for assignment in re.findall(r"--set ([^ ]+)", line):
                key, _, raw = assignment.partition("=")
                value: object = {"true": True, "false": False}.get(raw, raw)
                if re.fullmatch(r"-?\d+", raw):
                    value = int(raw)
                *parents, leaf = key.split(".")
                node = values
                for parent in parents:
                    node = node.setdefault(parent, {})  # type: ignore[assignment]
                node[leaf] = value
            found.append((source.name, values))
    return found


HELM_SETS = helm_sets()


@pytest.mark.parametrize("where, values", HELM_SETS, ids=[w for w, _ in HELM_SETS])
def test_helm_set_values_are_valid(where: str, values: dict[str, object]) -> None:
    """What a shown `helm install --set ...` would give the chart passes its schema."""
    from tests.chart import render

    assert len(HELM_SETS) >= 4
    render(values)  # Helm's own values.schema.json check, and the templates


OUTPUTS = [b for b in BLOCKS if b.marker == "output"]


@pytest.mark.parametrize("block", OUTPUTS, ids=[b.id for b in OUTPUTS])
def test_console_sessions_print_what_the_page_shows(block: Block) -> None:
    assert block.lang == "console" and block.body.startswith("$ ")
    status = None
    for session in re.split(r"^\$ ", block.body, flags=re.M)[1:]:
        command, _, shown = session.partition("\n")
        if command == "echo $?":
            assert f"{status}\n" == shown, f"{block.id}: exit status {status}"
            continue
        args = _cli_args(shlex.split(command))
        assert args is not None, f"{block.id}: only the CLI's commands are run: {command}"
        run = [sys.executable, "-m", "webhook", *args]
        out, err = subprocess.PIPE, subprocess.STDOUT  # as a terminal shows them: interleaved
        done = subprocess.run(run, cwd=REPO, timeout=60, text=True, stdout=out, stderr=err)
        status = done.returncode
        assert done.stdout == shown, f"{block.id}: `{command}` prints otherwise"


# --- commands -----------------------------------------------------------------------------------


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, re.M))


def commands() -> list[tuple[str, str]]:
    """(where, command) of every local command in the docs' shell blocks: `make`, `python -m
    webhook` and the installed entry points, one per pipeline stage."""
    found = []
    for block in BLOCKS:
        if block.lang not in ("sh", "console", "bash") or block.marker == "not-runnable":
            continue
        for line in block.body.replace("\\\n", " ").splitlines():
            if block.lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            for stage in re.split(r"\s(?:\||&&|;)\s", line):
                try:
                    words = shlex.split(stage, comments=True)
                except ValueError:  # not a command line (a heredoc's contents)
                    continue
                while words and re.match(r"^[A-Z_]+=", words[0]):
                    words.pop(0)
                if words and (words[0] == "make" or _cli_args(words) is not None):
                    found.append((block.id, stage.strip()))
    return found


def _cli_args(words: list[str]) -> list[str] | None:
    """The arguments of a command that runs this project's CLI, else None."""
    for prefix in CLI_PREFIXES:
        if words[: len(prefix)] == prefix:
            args = words[len(prefix) :]
            for i, word in enumerate(args):  # a redirection ends the command
                if word.startswith((">", "<", "2>")):
                    return args[:i]
            return args
    return None


COMMANDS = commands()


def test_the_docs_show_local_commands() -> None:
    shown = {c.split()[0] for _, c in COMMANDS}
    assert {"make", "python"} <= shown, shown


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{w} {c}" for w, c in COMMANDS])
def test_each_local_command_exists(where: str, command: str) -> None:
    words = shlex.split(command, comments=True)
    settings = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        key, _, value = words.pop(0).partition("=")
        settings[key] = value
    if words[0] == "make":
        for word in words[1:]:
            if "=" in word:
                key, _, value = word.partition("=")
                settings[key] = value
            else:
                assert word in make_targets(), f"{where}: no make target {word!r}"
        if "SERVE_ARGS" in settings:
            _parses(["serve", *shlex.split(settings["SERVE_ARGS"])], where)
        return
    args = _cli_args(words)
    assert args is not None
    _parses(args, where)


def _parses(args: list[str], where: str) -> None:
    try:
        ref.parser().parse_args(args)
    except SystemExit as exc:
        raise AssertionError(f"{where}: the CLI refuses {args}") from exc


# Flags of other programs the docs name in passing: kubectl, helm, kube-apiserver, mkdocs and
# the benchmarks (tests/bench/*.py, which take their own).
OTHER_PROGRAMS_FLAGS = {"--api-group", "--for", "--help", "--no-hooks", "--runtime-config",
                        "--strict", "--profile", "--sizes", "--snapshotted",
                        "--budgets",
                        # pip's and uv's (the lock file), kubectl's, buildx's, krew's
                        "--generate-hashes", "--require-hashes", "--only-binary", "--no-deps",
                        "--field-selector", "--push", "--manifest"}  # fmt: skip


def test_every_flag_the_prose_names_exists() -> None:
    """A `--flag` in the text (tables included) is one of the CLI's, so a renamed or removed
    flag cannot linger in the docs."""
    commands = ("plan", "serve", "explain", "uninstall", "certs", "samples")
    ours = set().union(*(ref.flags(c) for c in commands), {"--version"})  # --version: the root's
    unknown: dict[str, str] = {}
    for page in PAGES:
        prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for span in re.findall(r"`([^`\n]+)`", prose):
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", span):
                if flag not in ours | OTHER_PROGRAMS_FLAGS:
                    unknown.setdefault(flag, page.name)
    assert not unknown, f"flags the CLI does not have: {unknown}"


def test_the_flag_table_in_words_has_the_parsers_defaults() -> None:
    """concepts/admission.md says more about each `serve` flag than its help text; its Default
    column must still be the parser's (sizes in KiB/MiB, "all" for an empty list)."""
    serve = ref.subcommands(ref.parser())["serve"]
    defaults = {f: str(a.default) for a in serve._actions for f in a.option_strings}
    units = {"KiB": 1024, "MiB": 1024 * 1024}
    rows = 0
    for line in (DOCS / "concepts" / "admission.md").read_text().splitlines():
        row = re.match(r"^\| (`--[^|]*) \| ([^|]*) \|", line)
        if not row:
            continue
        rows += 1
        flags = re.findall(r"`(--[a-z-]+)`", row[1])
        shown = []
        for text in (part.strip().strip("`") for part in row[2].split(", ")):
            number, _, unit = text.partition(" ")
            shown.append(str(int(number) * units[unit]) if unit in units else text)
        if len(flags) == 1:
            shown = [",".join(shown)]
        shown = ["" if text == "all" else text for text in shown]
        expected = [defaults[f] for f in flags]
        assert shown == expected, f"{flags}: the table says {shown}, the parser {expected}"
    assert rows >= 40


# --- names the docs use, and the generated pages' completeness ----------------------------------


def chart_alerts() -> set[str]:
    from tests.chart import render

    rule = render({"monitoring": {"prometheusRule": {"enabled": True}}}).one("PrometheusRule")
    return {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}


# A name followed by - or . is a file's (the wheel's), not a metric's.
_METRIC = re.compile(
    r"`((?:trainjob_scheduling|controller_runtime|workqueue|certwatcher|leader_election)_\w+)"
    r"(?![-.\w])"
)


def test_every_metric_the_docs_name_is_exported() -> None:
    families = {name for name, *_ in ref.metric_families()}
    known = families | {f.removesuffix("_total") for f in families}
    named = {m for page in PAGES for m in _METRIC.findall(page.read_text())}
    named |= set(_METRIC.findall((ref.CHART / "README.md").read_text()))
    unknown = sorted(n for n in named if re.sub(r"_(bucket|count|sum)$", "", n) not in known)
    assert not unknown, f"the docs name metrics the service does not export: {unknown}"


def test_the_metric_table_in_words_has_the_registrys_labels() -> None:
    """tasks/metrics.md says more about each metric than its help text; its Labels column must
    still be the registry's."""
    labels = {name: set(found) for name, _, found, _ in ref.metric_families()}
    rows = 0
    for line in (DOCS / "tasks" / "metrics.md").read_text().splitlines():
        row = re.match(r"^\| (`[a-z_]+`(?:, `[a-z_]+`)*) \| ([^|]*) \|", line)
        if not row:
            continue
        rows += 1
        shown = {re.sub(r" \(.*\)$", "", x.strip()) for x in row[2].split(",") if x.strip()}
        for name in re.findall(r"`([a-z_]+)`", row[1]):
            assert labels[name] == shown, (
                f"{name}: the table says {shown}, the registry {labels[name]}"
            )
    assert rows >= 15


def test_every_alert_has_what_to_do() -> None:
    """Each alert the chart's PrometheusRule fires has a row in Act on an alert's "What to do",
    and the docs name no alert the chart does not have."""
    alerts = chart_alerts()
    page = (DOCS / "tasks" / "alerts.md").read_text()
    todo = page[page.index("## What to do") :]
    assert alerts <= set(re.findall(r"^\| (TrainJobScheduling\w+) \|", todo, re.M))
    named = {a for p in PAGES for a in re.findall(r"\bTrainJobScheduling[A-Z]\w+", p.read_text())}
    assert named <= alerts, f"not the chart's: {named - alerts}"


def test_every_event_reason_is_explained() -> None:
    reasons = ref.event_reasons()
    assert {"Created", "StandingDown", "Conflict"} <= set(reasons)
    missing = sorted(set(reasons) - set(ref.EVENT_MEANING))
    assert not missing, f"explain these Event reasons in tests/docs_reference.py: {missing}"
    stale = sorted(set(ref.EVENT_MEANING) - set(reasons))
    assert not stale, f"no longer posted, remove from EVENT_MEANING: {stale}"


def test_the_status_page_has_every_condition_reason() -> None:
    """The reasons table of reference/status.md is the code's REASONS, and every Event reason the
    condition is made from is one the gathering above found (so it cannot miss a way of
    posting one)."""
    from webhook.core.condition import FROM_EVENT, REASONS

    page = ref.status_page()
    for reason, doc in REASONS.items():
        assert f"| `{reason}` | `{doc.status}` | {ref.cell(doc.meaning)} |" in page, reason
    assert set(FROM_EVENT) <= set(ref.event_reasons())


def test_every_label_and_annotation_constant_is_documented() -> None:
    documented = {(module, name) for module, name, *_ in ref.KEYS}
    missing = sorted(ref.key_constants() - documented)
    assert not missing, f"add these to KEYS in tests/docs_reference.py: {missing}"


def test_every_label_key_in_the_code_is_on_the_metadata_page() -> None:
    """Any string in webhook/ shaped like a label key is a label, annotation or taint the page
    shows (or a known other thing), so a new one cannot go undocumented."""
    page = ref.metadata_page()
    missing = {k: where for k, where in ref.key_strings().items()
               if f"`{k}`" not in page and k not in ref.NOT_LABELS}  # fmt: skip
    assert not missing, f"document these in tests/docs_reference.py (KEYS): {missing}"


def test_every_webhook_is_explained() -> None:
    from webhook.admission.routes import WEBHOOKS

    assert {w.path for w in WEBHOOKS} == set(ref.WEBHOOK_PURPOSE)
    assert "not described yet" not in ref.webhooks_page()


def test_every_rbac_rule_is_explained() -> None:
    keys = [k for _, _, rule in ref.rbac_rules() for k in ref.rbac_keys(rule)]
    assert len(keys) > 15
    assert not [k for k in keys if k not in ref.RBAC_WHY]


def test_generated_pages_cover_the_code() -> None:
    cli_page = re.sub(
        r"<code>(.*?)</code>", lambda m: "`" + m[1].replace("<wbr>", "") + "`", ref.cli_page()
    )
    for command in ("plan", "serve", "explain", "certs"):
        for flag in ref.flags(command):
            assert f"`{flag}`" in cli_page, flag
    values_page = ref.values_page()
    from tests.chart import leaves

    values = yaml.safe_load((ref.CHART / "values.yaml").read_text())
    cells = re.findall(r"^\| <code>(.+?)</code>", values_page, re.M)
    rows = {cell.replace("<wbr>", "") for cell in cells}
    assert not [p for p, _ in leaves(values) if not any(p.startswith(r) for r in rows)]
    runtime_rows, trainjob_rows = ref.denial_rows()
    assert len(runtime_rows) >= 50 and len(trainjob_rows) >= 5


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """`make docs` is strict: a link to a missing page or anchor stops the build (so CI fails
    on it). Built from a copy of docs/ with one broken anchor added."""
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    for name in ("tests", "webhook", "charts"):
        (tmp_path / name).symlink_to(REPO / name)
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](operations.md#no-such-section)\n")
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", "site"]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run(build, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "no-such-section" in done.stderr, done.stderr
