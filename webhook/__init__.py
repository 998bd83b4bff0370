"""Workload-aware (gang + topology) scheduling for Kubeflow TrainJobs: webhooks and reconciler."""

__version__ = "0.1.0"
