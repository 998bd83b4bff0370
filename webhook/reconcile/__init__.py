"""The reconciler: Workloads and PodGroups for every TrainJob, through their whole life."""
