"""Every metric the service exports, in one registry per service.

Names follow controller-runtime and client-go (so existing dashboards and alerts work); the
service's own signals are prefixed `trainjob_scheduling_`. No label ever carries an object's name:
label values come from small fixed sets (webhook paths, controller names, reasons).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

# Reviews take well under a millisecond to a few; the API server gives up after 30 s at most.
WEBHOOK_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# controller-runtime's reconcile buckets, trimmed: from 5 ms to a minute.
RECONCILE_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0,
)  # fmt: skip
# client-go's workqueue buckets: 10 ns to 1000 s, by powers of ten.
WORKQUEUE_BUCKETS = tuple(10.0**exponent for exponent in range(-8, 4))

DECISIONS = ("allowed", "patched", "denied", "errored")
# Why the pod webhook held (denied) a TrainJob pod's creation: it could not tie it safely, and
# the Job controller retries with backoff (issue 26's design). Any other reason counts as Other.
HELD_REASONS = (
    "TrainJobNotCached",  # the TrainJob exists (a live read says) but is not in this cache yet
    "NotFrozen",  # no runtime snapshot yet while its runtime has scheduling
    "GangApiUnavailable",  # the gang API is not served, not known yet, or not listed yet
    "SchedulerMismatch",  # the pod names another scheduler than its gang's
    "PodGroupTerminating",  # the PodGroup it would name is being deleted
    "PodGroupNotOurs",  # the PodGroup it would name was not made by this service for it
    "LookupFailed",  # the TrainJob is not cached and the API server could not be asked
    "RuntimeNotFound",  # no snapshot yet and its runtime is not in the cache
    "InvalidPlan",  # its frozen runtime does not plan
    "PlanVersionUnknown",  # a newer release froze its plan (a rollback): hands off
    "TrainJobDeleting",  # its TrainJob is being deleted: no gang is made for it again
    "TrainJobSuspended",  # its TrainJob is suspended in the cache: a resume not seen yet
    "GangKindUnavailable",  # a tree its backend or the cluster cannot make
    "InvalidLabels",  # its restart-attempt label is not a count
    "JobSetUnknown",  # its JobSet (the restart attempt) is not in the cache yet
    "RestartAttemptMismatch",  # its restart-attempt label is not its JobSet's attempt
    "TrainJobFinished",  # its TrainJob has finished: its gang was released
    "TrainJobGone",  # its TrainJob is gone: its JobSet, a TrainJob's, is being collected
    "Other",
)
# Why a pod of a TrainJob whose runtime schedules gangs was admitted with no schedulingGroup.
UNTIED_REASONS = (
    "FrozenNoGang",  # the TrainJob started without a gang: never ganged mid-flight
    "StoodDown",  # another controller schedules the TrainJob
    "NoGangBackend",  # its pods name a scheduler no gang backend serves
    "Other",
)
RECONCILE_RESULTS = ("success", "error", "requeue", "requeue_after")


class Metrics:
    """The service's metrics; each instance has its own registry, so several services in one
    process (the tests) never share a series."""

    def __init__(self) -> None:
        # `_created` series are not what Kubernetes dashboards expect, and double every counter.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)  # registers itself only where the interpreter has gc stats

        # --- webhooks: `webhook` is the URL path --------------------------------------------
        self.webhook_requests = Counter(
            "controller_runtime_webhook_requests",
            "Admission requests by webhook path and HTTP status code.",
            ["webhook", "code"],
            registry=r,
        )
        self.webhook_latency = Histogram(
            "controller_runtime_webhook_latency_seconds",
            "Time to answer an admission request, by webhook path.",
            ["webhook"],
            buckets=WEBHOOK_BUCKETS,
            registry=r,
        )
        self.webhook_in_flight = Gauge(
            "controller_runtime_webhook_requests_in_flight",
            "Admission requests being answered now, by webhook path.",
            ["webhook"],
            registry=r,
        )
        self.admission_decisions = Counter(
            "trainjob_scheduling_admission_reviews",
            "Answered AdmissionReviews by webhook path, operation and decision "
            "(allowed, patched, denied, errored).",
            ["webhook", "operation", "decision"],
            registry=r,
        )

        # --- reconciler ---------------------------------------------------------------------
        self.reconcile_total = Counter(
            "controller_runtime_reconcile",
            "Reconciliations by controller and result (success, error, requeue, requeue_after).",
            ["controller", "result"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "controller_runtime_reconcile_errors",
            "Reconciliations that ended in an error, by controller.",
            ["controller"],
            registry=r,
        )
        self.reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Time per reconciliation, by controller.",
            ["controller"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )

        # --- work queue (client-go names) ---------------------------------------------------
        queue = ["name", "controller"]
        self.workqueue_depth = Gauge(
            "workqueue_depth", "Items waiting in the work queue.", queue, registry=r
        )
        self.workqueue_adds = Counter(
            "workqueue_adds", "Items added to the work queue.", queue, registry=r
        )
        self.workqueue_queue_duration = Histogram(
            "workqueue_queue_duration_seconds",
            "Time an item waits in the work queue before it is processed.",
            queue,
            buckets=WORKQUEUE_BUCKETS,
            registry=r,
        )
        self.workqueue_work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "Time processing an item from the work queue takes.",
            queue,
            buckets=WORKQUEUE_BUCKETS,
            registry=r,
        )
        self.workqueue_unfinished_work = Gauge(
            "workqueue_unfinished_work_seconds",
            "Seconds of work in progress not yet finished (large values mean stuck workers).",
            queue,
            registry=r,
        )
        self.workqueue_longest_running = Gauge(
            "workqueue_longest_running_processor_seconds",
            "Seconds the longest-running worker has been processing its item.",
            queue,
            registry=r,
        )
        self.workqueue_retries = Counter(
            "workqueue_retries", "Items put back on the work queue to retry.", queue, registry=r
        )

        # --- watches, certificates, leadership, the gang API --------------------------------
        self.watch_restarts = Counter(
            "trainjob_scheduling_watch_restarts",
            "Watches restarted after an error or an expired resourceVersion, by resource.",
            ["resource"],
            registry=r,
        )
        self.watches_refused = Gauge(
            "trainjob_scheduling_watches_refused",
            "Lists and watches the API server refuses now, retried slowly, by resource and "
            "reason: namespace-gone (a watched namespace deleted), forbidden (an RBAC rule "
            "missing, or a namespace deleted with its Role).",
            ["resource", "reason"],
            registry=r,
        )
        self.api_requests = Counter(
            "trainjob_scheduling_api_requests",
            "Requests the service made of the API server, by verb (HTTP method; WATCH for a "
            "watch) and HTTP status code (error: no answer).",
            ["verb", "code"],
            registry=r,
        )
        self.cert_reads = Counter(
            "certwatcher_read_certificate",
            "Reads of the serving certificate files.",
            registry=r,
        )
        self.cert_read_errors = Counter(
            "certwatcher_read_certificate_errors",
            "Reads of the serving certificate files that failed (unreadable or not a valid pair).",
            registry=r,
        )
        self.cert_expiry = Gauge(
            "trainjob_scheduling_certificate_expiry_timestamp_seconds",
            "Unix time at which a certificate expires: the one being served (serving), and the "
            "CA that issued it (ca), when the service knows it.",
            ["certificate"],
            registry=r,
        )
        self.leader = Gauge(
            "leader_election_master_status",
            "1 while this replica holds the leader lease, else 0.",
            ["name"],
            registry=r,
        )
        self.gang_api_available = Gauge(
            "trainjob_scheduling_gang_api_available",
            "1 when discovery shows scheduling.k8s.io/v1beta1 (1.36: v1alpha2) serving workloads "
            "and podgroups "
            "(the native backend's API; the others are in ..._backend_api_available).",
            registry=r,
        )
        self.backend_api_available = Gauge(
            "trainjob_scheduling_backend_api_available",
            "1 when discovery shows the API of a gang backend (its CRDs) served, by backend.",
            ["backend"],
            registry=r,
        )
        self.trainjobs_without_backend = Gauge(
            "trainjob_scheduling_trainjobs_without_backend",
            "TrainJobs whose pods name a scheduler whose gang backend's API is not served, by "
            "backend: they get no gang until it is.",
            ["backend"],
            registry=r,
        )
        self.trainjobs_stood_down = Gauge(
            "trainjob_scheduling_trainjobs_stood_down",
            "TrainJobs for which another controller made the gang objects (this service "
            "creates nothing for them).",
            registry=r,
        )
        self.gang_fields_dropped = Gauge(
            "trainjob_scheduling_gang_fields_dropped",
            "TrainJobs whose gang objects lack a field the service set, because the API server "
            "dropped it (its feature gate is off), by kind, field and gate. The gang is made "
            "without it; nothing is recreated for it.",
            ["kind", "field", "gate"],
            registry=r,
        )
        self.gangs_degraded = Gauge(
            "trainjob_scheduling_gangs_degraded",
            "Gangs admitted that now have fewer live pods than their minCount (lost to eviction, "
            "preemption or a failed node), as the leader's GangScheduling condition says.",
            registry=r,
        )
        self.gang_degradations = Counter(
            "trainjob_scheduling_gang_degradations",
            "Times an admitted gang fell below its minCount of live pods, by namespace.",
            ["namespace"],
            registry=r,
        )
        self.pods_held = Counter(
            "trainjob_scheduling_pods_held",
            "Creations of TrainJob pods the pod webhook denied to hold them, because it could "
            "not tie them to their gang safely (the Job controller retries), by reason.",
            ["reason"],
            registry=r,
        )
        self.pods_untied = Counter(
            "trainjob_scheduling_pods_untied",
            "Pods of a TrainJob whose runtime schedules gangs, admitted without a "
            "schedulingGroup (no gang for them, on purpose), by reason.",
            ["reason"],
            registry=r,
        )
        self.oldest_hold_age = Gauge(
            "trainjob_scheduling_oldest_hold_age_seconds",
            "Seconds since the oldest hold this replica still remembers began: a Job whose "
            "pod creations it held and has not woken yet (holds are for faults: one that "
            "lasts is one to look at). 0 when none.",
            registry=r,
        )
        self.jobs_woken = Counter(
            "trainjob_scheduling_jobs_woken",
            "Jobs woken (an annotation the Job controller syncs on) once the pods this replica "
            "held would be tied, so their Job's backoff does not decide when the gang starts, "
            "by the hold's reason (ServiceAway: a Job lacking pods when the replica started).",
            ["reason"],
            registry=r,
        )
        self.pods_regrouped = Counter(
            "trainjob_scheduling_pods_regrouped",
            "Pods of a ganged TrainJob that came naming another PodGroup (the Job controller's "
            "own per-Job gang, WorkloadWithJob, for a Job created while this service could not "
            "mark it) and were tied to their TrainJob's gang instead.",
            registry=r,
        )
        for reason in HELD_REASONS:
            self.pods_held.labels(reason=reason)  # every series from 0: rate() sees the first
        for reason in UNTIED_REASONS:
            self.pods_untied.labels(reason=reason)
        self.gangs_with_untied_pods = Gauge(
            "trainjob_scheduling_gangs_with_untied_pods",
            "TrainJobs with gang objects some of whose pending or live pods have no "
            "schedulingGroup (their gang may wait for them for ever), as the leader's "
            "GangScheduling condition says (PodsUntied).",
            registry=r,
        )
        self.status_writes = Counter(
            "trainjob_scheduling_status_writes",
            "Server-side applies of the GangScheduling condition, by its reason (one per change "
            "of status, reason or message, never per pass).",
            ["reason"],
            registry=r,
        )
        self.events = Counter(
            "trainjob_scheduling_events",
            "Kubernetes Events the service posted, by reason.",
            ["reason"],
            registry=r,
        )
        self.events_dropped = Counter(
            "trainjob_scheduling_events_dropped",
            "Kubernetes Events not posted because the recorder's queue was full.",
            registry=r,
        )
        self.events_refused = Counter(
            "trainjob_scheduling_events_refused",
            "Kubernetes Events dropped, never retried, because the API server refused them or "
            "one before in the same namespace, by reason: namespace-gone, forbidden.",
            ["reason"],
            registry=r,
        )
        for reason in ("namespace-gone", "forbidden"):  # kube/refusal.py's REFUSALS
            self.events_refused.labels(reason=reason)

    def held(self, reason: str) -> None:
        """One pod creation denied to hold it (`reason`: one of HELD_REASONS)."""
        self.pods_held.labels(reason=reason if reason in HELD_REASONS else "Other").inc()

    def untied(self, reason: str) -> None:
        """One pod of a ganged runtime admitted without a group (one of UNTIED_REASONS)."""
        self.pods_untied.labels(reason=reason if reason in UNTIED_REASONS else "Other").inc()

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition (body, content type): Prometheus text, or OpenMetrics when the
        scraper's Accept header asks for it."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
