"""Typed views of the Kubeflow Trainer objects the service reads.

Every model keeps fields it does not declare (`extra="allow"`), so an object from a newer Trainer
round-trips through the service without losing data. Only what scheduling needs is typed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_API_VERSION = f"{TRAINER_GROUP}/v1alpha1"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
TRAINJOB_KIND = "TrainJob"
CLUSTER_RUNTIME_KIND = "ClusterTrainingRuntime"
NAMESPACED_RUNTIME_KIND = "TrainingRuntime"
RUNTIME_KINDS = (CLUSTER_RUNTIME_KIND, NAMESPACED_RUNTIME_KIND)
DEFAULT_SCHEDULER = "default-scheduler"


class Model(BaseModel):
    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        """The JSON shape, with unknown fields kept and unset ones left out."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")


class ObjectMeta(Model):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


# --- spec.scheduling (KEP-3015, in the Kubernetes 1.37 shapes) ---------------------------------


class Gang(Model):
    min_count: int | None = None


class SchedulingPolicy(Model):
    basic: dict[str, Any] | None = None
    gang: Gang | None = None


class TopologyConstraint(Model):
    key: str | None = None


class SchedulingConstraints(Model):
    topology: list[TopologyConstraint] | None = None


class DisruptionMode(Model):
    single: dict[str, Any] | None = None
    all: dict[str, Any] | None = None


class ResourceClaim(Model):
    name: str | None = None
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


class GroupSettings(Model):
    """The four fields that configure a group at every level."""

    scheduling_policy: SchedulingPolicy | None = None
    scheduling_constraints: SchedulingConstraints | None = None
    disruption_mode: DisruptionMode | None = None
    resource_claims: list[ResourceClaim] | None = None


# (JSON name, attribute) of the four group fields.
GROUP_SETTING_FIELDS = (
    ("schedulingPolicy", "scheduling_policy"),
    ("schedulingConstraints", "scheduling_constraints"),
    ("disruptionMode", "disruption_mode"),
    ("resourceClaims", "resource_claims"),
)


class ReplicatedJobEntry(GroupSettings):
    """A level-2 entry; with `job` it is a level-3 entry instead."""

    target_replicated_jobs: list[str] | None = None
    job: GroupSettings | None = None


class Scheduling(GroupSettings):
    """GroupKind-1 fields plus the level-2/3 entries (mutually exclusive)."""

    replicated_jobs: list[ReplicatedJobEntry] | None = None


# --- the JobSet template inside a runtime ------------------------------------------------------


class DependsOn(Model):
    name: str
    status: str


class Container(Model):
    """What the service reads of a container: its name and the resources it asks for."""

    name: str | None = None
    resources: dict[str, Any] | None = None
    restart_policy: str | None = None  # "Always" on an init container: a sidecar


class PodSpec(Model):
    scheduler_name: str | None = None
    priority_class_name: str | None = None
    preemption_policy: str | None = None
    scheduling_group: Any = None
    containers: list[Container] | None = None
    init_containers: list[Container] | None = None
    overhead: dict[str, Any] | None = None
    # Read leniently by feasibility (core/placement.py), so untyped here: a malformed value is
    # the API server's to refuse, not a reason to deny a runtime.
    node_selector: Any = None
    affinity: Any = None
    tolerations: Any = None


_NO_POD_SPEC = PodSpec()  # read only: what a ReplicatedJob without a pod spec reads as


class PodTemplate(Model):
    metadata: ObjectMeta | None = None
    spec: PodSpec | None = None


class JobSpec(Model):
    parallelism: int | None = None
    scheduling: Any = None
    template: PodTemplate | None = None


class JobTemplate(Model):
    metadata: ObjectMeta | None = None
    spec: JobSpec | None = None


class ReplicatedJob(Model):
    name: str
    replicas: int | None = None
    depends_on: list[DependsOn] | None = None
    template: JobTemplate | None = None

    @property
    def replica_count(self) -> int:
        return 1 if self.replicas is None else self.replicas

    @property
    def ancestor(self) -> str | None:
        meta = self.template.metadata if self.template else None
        return (meta.labels or {}).get(ANCESTOR_LABEL) if meta else None

    @property
    def parallelism(self) -> int:
        spec = self.template.spec if self.template else None
        return 1 if spec is None or spec.parallelism is None else spec.parallelism

    @property
    def scheduler(self) -> str:
        """The scheduler its pods name (the API server's default when unset)."""
        return self.pod_spec.scheduler_name or DEFAULT_SCHEDULER

    @property
    def pod_spec(self) -> PodSpec:
        spec = self.template.spec if self.template else None
        tmpl = spec.template if spec else None
        return tmpl.spec if tmpl and tmpl.spec else _NO_POD_SPEC


class StartupPolicy(Model):
    startup_policy_order: str | None = None


class FailurePolicyRule(Model):
    action: str | None = None


class FailurePolicy(Model):
    """What JobSet does when a Job fails: its rules' actions (the gang's restarts depend on
    them), and how it restarts."""

    rules: list[FailurePolicyRule] | None = None
    restart_strategy: str | None = None


class JobSetSpec(Model):
    replicated_jobs: list[ReplicatedJob] = Field(default_factory=list)
    startup_policy: StartupPolicy | None = None
    scheduling: Any = None
    failure_policy: FailurePolicy | None = None


class JobSetTemplate(Model):
    metadata: ObjectMeta | None = None
    spec: JobSetSpec = Field(default_factory=JobSetSpec)


class MPIPolicy(Model):
    run_launcher_as_node: bool | None = None


class MLPolicy(Model):
    num_nodes: int | None = None
    torch: dict[str, Any] | None = None
    mpi: MPIPolicy | None = None


class RuntimeSpec(Model):
    ml_policy: MLPolicy | None = None
    pod_group_policy: dict[str, Any] | None = None
    scheduling: Scheduling | None = None
    template: JobSetTemplate = Field(default_factory=JobSetTemplate)


class Runtime(Model):
    """A TrainingRuntime or ClusterTrainingRuntime (they share the spec)."""

    api_version: str = TRAINER_API_VERSION
    kind: str = CLUSTER_RUNTIME_KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: RuntimeSpec = Field(default_factory=RuntimeSpec)

    @property
    def replicated_jobs(self) -> list[ReplicatedJob]:
        return self.spec.template.spec.replicated_jobs


# --- TrainJob ----------------------------------------------------------------------------------


class RuntimeRef(Model):
    name: str | None = None
    api_group: str | None = None
    kind: str | None = None


class Trainer(Model):
    num_nodes: int | None = None
    resources_per_node: dict[str, Any] | None = None


class PodSpecPatch(Model):
    """The part of a TrainJob's pod spec patch the service reads (Trainer v2.4 lets a TrainJob
    choose its pods' scheduler here; feasibility reads its placement fields, kept as extras)."""

    scheduler_name: str | None = None


class PodTemplatePatch(Model):
    spec: PodSpecPatch | None = None


class JobSpecPatch(Model):
    template: PodTemplatePatch | None = None


class JobTemplatePatch(Model):
    spec: JobSpecPatch | None = None


class ReplicatedJobPatch(Model):
    name: str | None = None
    template: JobTemplatePatch | None = None


class JobSetSpecPatch(Model):
    replicated_jobs: list[ReplicatedJobPatch] | None = None


class JobSetTemplatePatch(Model):
    spec: JobSetSpecPatch | None = None


class RuntimeSpecPatch(Model):
    template: JobSetTemplatePatch | None = None


class RuntimePatch(Model):
    """One entry of `spec.runtimePatches` (keyed by `manager`; Kueue writes one)."""

    manager: str | None = None
    training_runtime_spec: RuntimeSpecPatch | None = None


class TrainJobSpec(Model):
    runtime_ref: RuntimeRef = Field(default_factory=RuntimeRef)
    trainer: Trainer | None = None
    suspend: bool | None = None
    managed_by: str | None = None
    runtime_patches: list[RuntimePatch] | None = None


class Condition(Model):
    type: str
    status: str


class TrainJobStatus(Model):
    conditions: list[Condition] | None = None


class TrainJob(Model):
    """A TrainJob as the service reads it. The cache keeps only what is read of a stored one
    (`core/kept.py`): a field read here must be kept there (tests/test_kept.py fails if not)."""

    api_version: str = TRAINER_API_VERSION
    kind: str = TRAINJOB_KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TrainJobSpec = Field(default_factory=TrainJobSpec)
    status: TrainJobStatus | None = None

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"

    @property
    def num_nodes(self) -> int | None:
        return self.spec.trainer.num_nodes if self.spec.trainer else None

    @property
    def resources_per_node(self) -> dict[str, Any] | None:
        return self.spec.trainer.resources_per_node if self.spec.trainer else None

    def scheduler_of(self, rj: ReplicatedJob) -> str:
        """The scheduler the pods of one of its ReplicatedJobs will name."""
        return self.scheduler_override(rj.name) or rj.scheduler

    def pod_patches(self, replicated_job: str) -> list[dict[str, Any]]:
        """The pod spec patches of this TrainJob for one of its ReplicatedJobs, in order."""
        found = []
        for patch in self.spec.runtime_patches or []:
            template = patch.training_runtime_spec.template if patch.training_runtime_spec else None
            jobs = template.spec.replicated_jobs if template and template.spec else None
            for rj in jobs or []:
                job = rj.template.spec if rj.template else None
                pod = job.template.spec if job and job.template else None
                if rj.name == replicated_job and pod is not None:
                    found.append(pod.dump())
        return found

    def scheduler_override(self, replicated_job: str) -> str | None:
        """The scheduler this TrainJob's runtime patches give the pods of a ReplicatedJob (the
        last patch that sets one wins, as patches apply in order)."""
        found = None
        for patch in self.spec.runtime_patches or []:
            template = patch.training_runtime_spec.template if patch.training_runtime_spec else None
            jobs = template.spec.replicated_jobs if template and template.spec else None
            for rj in jobs or []:
                job = rj.template.spec if rj.template else None
                pod = job.template.spec if job and job.template else None
                if rj.name == replicated_job and pod is not None and pod.scheduler_name:
                    found = pod.scheduler_name
        return found

    @property
    def runtime_kind(self) -> str:
        """The runtime kind, defaulted the way the TrainJob CRD defaults it."""
        return self.spec.runtime_ref.kind or CLUSTER_RUNTIME_KIND
