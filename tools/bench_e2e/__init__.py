"""`make bench-e2e`: the service's figures on a real control plane (the end-to-end harness).

Part A (issue 36): how long a gang takes to be bound after a disturbance (a resume with pods
still terminating, a leader failover, the service down, a JobSet restart, a re-apply), beyond
what the same gang takes on an undisturbed service; holds and wakes. Part B (issue 37): the
service's RSS and CPU, TrainJob -> PodGroup and pod admission with 100 and 1,000 TrainJobs
through the real Trainer, JobSet and Job controllers. `python -m tools.bench_e2e --help`;
docs/architecture/benchmarks.md has the figures and what each one means.
"""
