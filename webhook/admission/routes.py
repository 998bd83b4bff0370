"""The webhook paths, named the way controller-runtime names them, and what each one accepts."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.trainer import TRAINER_GROUP
from . import handlers as h
from .review import Decision, Review, errored


@dataclass(frozen=True)
class Webhook:
    verb: str  # "mutate" or "validate"
    group: str
    version: str
    kind: str
    resource: str
    handler: h.Handler
    variant: str = ""
    """A second webhook of the same resource (another failurePolicy or selector): its path
    ends in `-<variant>`."""

    @property
    def path(self) -> str:
        """controller-runtime's `/<verb>-<group with dots as dashes>-<version>-<kind>`."""
        path = f"/{self.verb}-{self.group.replace('.', '-')}-{self.version}-{self.kind.lower()}"
        return f"{path}-{self.variant}" if self.variant else path

    @property
    def name(self) -> str:
        return self.path.lstrip("/")

    def judge(self, review: Review) -> Decision | None:
        """None when the review is for this webhook's resource; else why it is not."""
        if (review.group, review.resource) == (self.group, self.resource):
            return None
        got = f"{review.group}/{review.resource}" if review.group else review.resource
        want = f"{self.group}/{self.resource}" if self.group else self.resource
        return errored(400, f"webhook {self.path} handles {want}, not {got or 'nothing'}")


TRAINER = TRAINER_GROUP
SCHEDULING = "scheduling.k8s.io"

WEBHOOKS: tuple[Webhook, ...] = (
    Webhook("mutate", "", "v1", "Pod", "pods", h.mutate_pod_review),
    # JobSet pods without the gang label (runtimes labelled before it existed, plain JobSets):
    # the same judgement, best effort (the chart's failurePolicy is Ignore).
    Webhook("mutate", "", "v1", "Pod", "pods", h.mutate_pod_review, "unlabelled"),
    Webhook("mutate", "batch", "v1", "Job", "jobs", h.mutate_job_review),
    Webhook("mutate", TRAINER, "v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes",
            h.mutate_runtime_review),
    Webhook("mutate", TRAINER, "v1alpha1", "TrainingRuntime", "trainingruntimes",
            h.mutate_runtime_review),
    Webhook("validate", TRAINER, "v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes",
            h.validate_runtime_review),
    Webhook("validate", TRAINER, "v1alpha1", "TrainingRuntime", "trainingruntimes",
            h.validate_runtime_review),
    Webhook("mutate", TRAINER, "v1alpha1", "TrainJob", "trainjobs", h.mutate_trainjob_review),
    Webhook("validate", TRAINER, "v1alpha1", "TrainJob", "trainjobs", h.validate_trainjob_review),
    # The runtime snapshot's tamper check alone, for requests that touch it (always Fail).
    Webhook("validate", TRAINER, "v1alpha1", "TrainJob", "trainjobs", h.guard_trainjob_review,
            "snapshot"),
    Webhook("mutate", SCHEDULING, "v1beta1", "Workload", "workloads",
            h.mutate_backend_object_review),
    Webhook("mutate", SCHEDULING, "v1beta1", "PodGroup", "podgroups",
            h.mutate_backend_object_review),
)  # fmt: skip
