"""`python -m webhook plan` run as a real process on the shipped samples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.apiserver_rules import objects_errors
from tests.nodes import nodes
from tests.paths import SAMPLES


def plan(*files: str) -> tuple[int, list[dict[str, Any]], str]:
    """`plan -f` each file (samples by name); `--nodes FILE` passes through."""
    args: list[str] = []
    rest = list(files)
    while rest:
        f = rest.pop(0)
        if f == "--nodes":
            args += [f, rest.pop(0)]
        else:
            args += ["-f", str(SAMPLES / f) if not f.startswith("/") else f]
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "plan", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, list(yaml.safe_load_all(proc.stdout)), proc.stderr


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_torch_100_nodes_level_one() -> None:
    code, objects, err = plan("torch-100-nodes.trainjob.yaml", "torch-distributed.runtime.yaml")
    assert code == 0, err
    (workload,) = by_kind(objects, "Workload")
    (pod_group,) = by_kind(objects, "PodGroup")
    (template,) = workload["spec"]["podGroupTemplates"]
    assert template["schedulingPolicy"] == {"gang": {"minCount": 100}}
    assert pod_group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 100}}
    assert pod_group["metadata"]["name"] == "my-job-f438be8c51"
    assert err == ""
    assert objects_errors(objects) == []


def test_deepspeed_level_two() -> None:
    code, objects, err = plan(
        "deepspeed-8-nodes.trainjob.yaml", "deepspeed-distributed.runtime.yaml"
    )
    assert code == 0, err
    (workload,) = by_kind(objects, "Workload")
    init, gang = workload["spec"]["podGroupTemplates"]
    assert init["name"].startswith("dataset-initializer-")
    assert init["schedulingPolicy"] == {"basic": {}}
    assert gang["name"].startswith("launcher-node-")
    assert gang["schedulingPolicy"] == {"gang": {"minCount": 8}}
    assert gang["schedulingConstraints"] == {"topology": [{"key": "topology.kubernetes.io/zone"}]}
    assert len(by_kind(objects, "PodGroup")) == 2
    assert err.splitlines() == [
        'Warning: scheduling: "launcher" starts after "node": it joins its gang later, '
        "outside minCount"
    ]


def test_rack_level_three() -> None:
    code, objects, err = plan("torch-rack.trainjob.yaml", "torch-rack.runtime.yaml")
    assert code == 0, err
    pod_groups = by_kind(objects, "PodGroup")
    assert [pg["metadata"]["name"].rsplit("-", 1)[0] for pg in pod_groups] == [
        "rack-job-node-0",
        "rack-job-node-1",
    ]
    for pg in pod_groups:
        assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}
        assert pg["spec"]["schedulingConstraints"] == {
            "topology": [{"key": "topology.kubernetes.io/rack"}]
        }
    assert objects_errors(objects) == []


def test_invalid_runtime_prints_field_errors_and_fails() -> None:
    code, objects, err = plan("invalid.runtime.yaml")
    assert code == 1
    assert objects == []
    assert err.startswith('error: ClusterTrainingRuntime "torchtune-broken" is invalid:\n')
    assert "* spec.scheduling.replicatedJobs[0].schedulingPolicy.gang.minCount: Forbidden" in err
    assert (
        '* spec.scheduling.replicatedJobs[1].targetReplicatedJobs[1]: Invalid value: "nodes"' in err
    )


def test_trainjob_of_an_invalid_runtime_gets_no_objects() -> None:
    code, objects, err = plan("torch-100-nodes.trainjob.yaml", "invalid.runtime.yaml")
    assert code == 1 and objects == []
    assert 'error: TrainJob "my-job" is invalid:' in err
    assert 'spec.runtimeRef.name: Not found: "torch-distributed"' in err


def test_a_runtime_admission_would_refuse_gets_its_trainjob_no_objects(tmp_path: Path) -> None:
    """A ReplicatedJob name over Trainer's cap is refused only when a runtime is created (one
    stored before the cap stays usable): `plan` judges a runtime from a file as a new one, so
    `plan | kubectl apply -f -` never makes objects for a runtime the cluster would refuse."""
    runtime = yaml.safe_load((SAMPLES / "torch-distributed.runtime.yaml").read_text())
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    node["name"] = "node-with-a-long-name"  # 21 characters: one over the cap
    path = tmp_path / "long-name.runtime.yaml"
    path.write_text(yaml.safe_dump(runtime))
    code, objects, err = plan("torch-100-nodes.trainjob.yaml", str(path))
    assert code == 1 and objects == [], objects
    runtime_said, name_error, *trainjob_said = err.splitlines()
    assert runtime_said == 'error: ClusterTrainingRuntime "torch-distributed" is invalid:'
    assert name_error.startswith("  * spec.template.spec.replicatedJobs[0].name: Too long: ")
    assert trainjob_said == [
        'error: TrainJob "my-job" is invalid:',
        '  * spec.runtimeRef.name: Invalid value: "torch-distributed": the '
        "ClusterTrainingRuntime in the given files is invalid (see above); fix it first",
    ]
    node["name"] = "node-with-a-long-nam"  # at the cap: planned
    path.write_text(yaml.safe_dump(runtime))
    code, objects, err = plan("torch-100-nodes.trainjob.yaml", str(path))
    assert code == 0 and [o["kind"] for o in objects] == ["Workload", "PodGroup"], err


def test_plan_says_what_admission_warns_of_requests_without_limits(tmp_path: Path) -> None:
    """The sample before its fix (GPUs requested without a limit), and a runtime whose sidecar
    does the same: `plan` prints the warnings admission gives, as whole sentences, and still
    the objects (warnings do not stop an apply)."""
    trainjob = yaml.safe_load((SAMPLES / "torch-100-nodes.trainjob.yaml").read_text())
    del trainjob["spec"]["trainer"]["resourcesPerNode"]["limits"]
    runtime = yaml.safe_load((SAMPLES / "torch-distributed.runtime.yaml").read_text())
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod["template"]["spec"]["containers"].append(
        {"name": "rdma", "resources": {"requests": {"rdma/ib": 1}, "limits": {"rdma/ib": 2}}}
    )
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump_all([trainjob, runtime]))
    code, objects, err = plan(str(path))
    assert code == 0 and [o["kind"] for o in objects] == ["Workload", "PodGroup"], err
    assert err.splitlines() == [
        "Warning: spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers[1]"
        ".resources.requests[rdma/ib]: requests 1 but limits 2; the API server refuses pods whose "
        "request for an extended resource differs from its limit, so its TrainJobs would create "
        "no pods: set its limits[rdma/ib] to 1",
        "Warning: spec.trainer.resourcesPerNode.requests[nvidia.com/gpu]: requests 4 without a "
        "limit; the API server refuses pods that request an extended resource without an equal "
        "limit, so the TrainJob would create no pods: set "
        "spec.trainer.resourcesPerNode.limits[nvidia.com/gpu] to 4",
    ]


def test_unreadable_input_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = plan(str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    code, _, err = plan(str(bad))
    assert code == 2 and "is not valid YAML" in err and "Traceback" not in err


def test_trainjob_of_an_unreadable_runtime_says_so(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\n"
        "metadata: {name: torch-distributed}\nspec: {scheduling: {}, template: 3}\n"
    )
    code, objects, err = plan("torch-100-nodes.trainjob.yaml", str(broken))
    assert code == 1 and objects == []
    assert "spec.template: Invalid value: 3: must be an object" in err
    assert (
        'spec.runtimeRef.name: Invalid value: "torch-distributed": the ClusterTrainingRuntime in '
        "the given files is invalid (see above); fix it first"
    ) in err


def test_samples_are_listed_printed_and_planned() -> None:
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "webhook", *args],
            input=stdin, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    listed = run("samples")
    assert listed.returncode == 0
    assert listed.stdout.split() == sorted(p.name for p in SAMPLES.glob("*.yaml"))
    printed = run("samples", "torch-100-nodes.trainjob.yaml", "torch-distributed.runtime.yaml")
    docs = list(yaml.safe_load_all(printed.stdout))
    assert [d["kind"] for d in docs] == ["TrainJob", "ClusterTrainingRuntime"]
    planned = run("plan", "-f", "-", stdin=printed.stdout)
    assert planned.returncode == 0, planned.stderr
    assert [d["kind"] for d in yaml.safe_load_all(planned.stdout)] == ["Workload", "PodGroup"]
    unknown = run("samples", "nope.yaml")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("error: no sample nope.yaml; there are: deepspeed-8-nodes")


def test_tpu_slices_gang_of_gangs() -> None:
    code, objects, err = plan("tpu-slices.trainjob.yaml", "tpu-slices.runtime.yaml")
    assert code == 0, err
    assert [o["kind"] for o in objects] == ["Workload", *["CompositePodGroup"] * 2,
                                            *["PodGroup"] * 5]  # fmt: skip
    root, slices = by_kind(objects, "CompositePodGroup")
    assert slices["spec"]["parentCompositePodGroupName"] == root["metadata"]["name"]
    assert slices["spec"]["schedulingPolicy"] == {"gang": {"minGroupCount": 4}}
    init, *racks = by_kind(objects, "PodGroup")
    assert init["spec"]["parentCompositePodGroupName"] == root["metadata"]["name"]
    assert {r["spec"]["parentCompositePodGroupName"] for r in racks} == {slices["metadata"]["name"]}
    assert {r["spec"]["schedulingPolicy"]["gang"]["minCount"] for r in racks} == {8}
    assert err == ""
    assert objects_errors(objects) == []


def test_a_tree_on_a_backend_without_trees_is_an_error() -> None:
    files = ["-f", str(SAMPLES / "tpu-slices.trainjob.yaml"),
             "-f", str(SAMPLES / "tpu-slices.runtime.yaml")]  # fmt: skip
    for backend in ("coscheduling", "volcano", "kai"):
        cmd = [sys.executable, "-m", "webhook", "plan", *files, "--backend", backend]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 1 and proc.stdout == "", proc.stdout
        assert f"which the {backend} gang backend cannot express" in proc.stderr


def test_plan_with_nodes_says_whether_each_gang_could_ever_fit(tmp_path: Path) -> None:
    """`--nodes` as `kubectl get nodes -o yaml` prints them: 80 nodes of 6 GPUs hold 480 GPUs
    but only 80 pods of 4 GPUs, so the 100 of the sample never fit (warned, with the numbers;
    the objects still print, to stdout)."""
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
              "items": nodes("gpu", 80, gpus=6)}  # fmt: skip
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(listed))
    code, objects, err = plan(
        "torch-100-nodes.trainjob.yaml", "torch-distributed.runtime.yaml", "--nodes", str(path)
    )
    assert code == 0 and [o["kind"] for o in objects] == ["Workload", "PodGroup"]
    assert err.splitlines() == [
        "Warning: can never fit: gang node of 100 pods does not fit in the cluster: the cluster "
        "holds 80 of them (80 nodes; 4 nvidia.com/gpu each)",
        "Feasibility (80 nodes, 1 node shape; as if empty):",
        "  gang node: 100 pods (node: 4 nvidia.com/gpu) in the cluster: can never fit "
        "(DomainTooSmall)",
        "    gang node of 100 pods does not fit in the cluster: the cluster holds 80 of them (80 "
        "nodes; 4 nvidia.com/gpu each)",
        "    the cluster: room for 80 of its pods (80 nodes)",
    ]
    # Node documents one by one work as well; with -o tree the numbers follow the tree.
    path.write_text(yaml.safe_dump_all(nodes("gpu", 50, gpus=8)))
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "plan", "-o", "tree", "--nodes", str(path),
         "-f", str(SAMPLES / "torch-100-nodes.trainjob.yaml"),
         "-f", str(SAMPLES / "torch-distributed.runtime.yaml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.splitlines()[-2:] == [
        "  gang node: 100 pods (node: 4 nvidia.com/gpu) in the cluster: fits",
        "    the cluster: room for 100 of its pods (50 nodes)",
    ]
    # Not nodes: a clear usage error.
    path.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [{"kind": "Pod"}]})
    )
    code, _, err = plan("torch-100-nodes.trainjob.yaml", "torch-distributed.runtime.yaml",
                        "--nodes", str(path))  # fmt: skip
    assert code == 2 and err == f"error: {path}: expected Nodes (kubectl get nodes -o yaml)\n"


def test_usage_names_the_command_as_it_was_started(tmp_path: Path) -> None:
    """`--help` and usage errors say how the user called it: the console script's name (also
    through a link of another name), `python -m webhook`, or the kubectl plugin."""
    scripts = Path(sys.executable).parent  # this virtualenv's console scripts (make setup)
    link = tmp_path / "tsw"
    link.symlink_to(scripts / "trainjob-scheduling-webhook")
    for command, usage in (
        ([str(scripts / "trainjob-scheduling-webhook"), "--help"], "trainjob-scheduling-webhook"),
        ([str(link), "plan"], "tsw plan"),
        ([sys.executable, "-m", "webhook", "--help"], "python -m webhook"),
        ([str(scripts / "kubectl-trainjob_scheduling"), "--help"], "kubectl trainjob-scheduling"),
    ):
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert (done.stdout or done.stderr).startswith(f"usage: {usage} "), done
