"""The one interface every gang backend implements."""

from __future__ import annotations

from typing import Any, Protocol

from ..core.plan import Plan

JsonObject = dict[str, Any]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "trainjob-scheduling-webhook"
TRAINJOB_LABEL = "trainer.kubeflow.org/trainjob-name"


class GangBackend(Protocol):
    """Turns a TrainJob's plan into the objects its scheduler needs, as JSON ready to send."""

    name: str

    def render(self, plan: Plan, parent_uid: str | None = None) -> list[JsonObject]:
        """Every object the plan needs, parents first. `parent_uid`, once known, lets
        children point at a parent object created earlier."""
        ...


def owner_labels(plan: Plan) -> dict[str, str]:
    """Labels that let a watch select just this service's objects of one TrainJob."""
    return {MANAGED_BY_LABEL: MANAGED_BY, TRAINJOB_LABEL: plan.trainjob_name}
