# Every target sets up its own virtualenv first, so each works on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SAMPLES := webhook/samples

CERT_DIR ?= certs
SERVE_ARGS ?=

.PHONY: setup test lint format typecheck unit docs docs-serve run certs plan bench prometheus image lock stamp release clean e2e e2e-chart e2e-matrix bench-e2e

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,docs]'
	touch $@

## test: everything CI runs: lint, format check, type check, the docs site, the pytest suite
test: lint typecheck docs unit

## lint: ruff, and codespell over the docs, the README and the code (.codespell-ignore: words
## that are meant)
lint: setup
	$(PY) -m ruff check webhook tests docs tools
	$(PY) -m ruff format --check webhook tests docs tools
	$(VENV)/bin/codespell --ignore-words .codespell-ignore --skip '*.min.js' docs README.md webhook charts/trainjob-scheduling/README.md

## docs: the documentation site into site/ (strict: a broken link or a warning fails); the
## reference pages are generated from the code (docs/_gen/gen_pages.py)
# The theme and mkdocs-gen-files print a banner about MkDocs 2 on every build; these silence it.
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true

docs: setup
	$(DOCS_ENV) $(PY) -m mkdocs build --strict --site-dir site

## docs-serve: the site on http://127.0.0.1:8000, rebuilt on every change
docs-serve: setup
	$(DOCS_ENV) $(PY) -m mkdocs serve --strict --dev-addr 127.0.0.1:8000

format: setup
	$(PY) -m ruff format webhook tests docs tools
	$(PY) -m ruff check --fix webhook tests docs tools

typecheck: setup
	$(PY) -m mypy

unit: setup
	$(PY) -m pytest $(PYTEST_ARGS)

## run: the webhook service on https://localhost:9443 (probes on :8081) with development
## certificates; it uses the cluster in $$KUBECONFIG when set, else runs without one
run: setup $(CERT_DIR)/tls.crt
	$(PY) -m webhook serve --cert-dir $(CERT_DIR) $(SERVE_ARGS)

## certs: a development CA and serving certificate in $(CERT_DIR)/ (kept if present)
certs: $(CERT_DIR)/tls.crt

$(CERT_DIR)/tls.crt: | setup
	$(PY) -m webhook certs --out $(CERT_DIR)

plan: setup
	$(PY) -m webhook plan -f $(SAMPLES)/torch-100-nodes.trainjob.yaml -f $(SAMPLES)/torch-distributed.runtime.yaml
	$(PY) -m webhook plan -f $(SAMPLES)/deepspeed-8-nodes.trainjob.yaml -f $(SAMPLES)/deepspeed-distributed.runtime.yaml
	$(PY) -m webhook plan -f $(SAMPLES)/torch-rack.trainjob.yaml -f $(SAMPLES)/torch-rack.runtime.yaml
	$(PY) -m webhook plan -o tree -f $(SAMPLES)/tpu-slices.trainjob.yaml -f $(SAMPLES)/tpu-slices.runtime.yaml

## e2e: the end-to-end suite (tests/e2e) against a real control plane: the cluster of
## $$KUBECONFIG, else the harness's ($(HARNESS_KUBECONFIG)) when it exists. The service runs
## outside the cluster (python -m webhook serve --kubeconfig ...) with the chart's webhooks
## registered for the run (deleted at the end; dead runs' are swept after it). E2E=1: no cluster
## is a failure, not a skip. E2E_ARGS: more pytest arguments (-k, --junitxml=...).
HARNESS_KUBECONFIG ?= $(HOME)/harness/kubeconfig
E2E_KUBECONFIG ?= $(or $(KUBECONFIG),$(wildcard $(HARNESS_KUBECONFIG)))
E2E_ARGS ?=
e2e: setup
	@test -n "$(E2E_KUBECONFIG)" || { echo "error: no cluster: set KUBECONFIG, or start the harness (its kubeconfig: $(HARNESS_KUBECONFIG))" >&2; exit 1; }
	@echo "e2e against $(E2E_KUBECONFIG)"
	@E2E=1 E2E_KUBECONFIG='$(E2E_KUBECONFIG)' $(PY) -m pytest tests/e2e -v $(E2E_ARGS); rc=$$?; \
		E2E_KUBECONFIG='$(E2E_KUBECONFIG)' $(PY) -m tests.e2e.registration; exit $$rc

## e2e-chart: the chart installed in the cluster with Helm (on the harness: on its real node,
## with the image node/build-images.sh built), `helm test`, then the e2e suite against that
## service (E2E_EXTERNAL_SERVICE=1), then `helm uninstall`, checked (tools/e2e_chart.py).
## E2E_CHART_VALUES: a values file merged over the harness's.
E2E_CHART_VALUES ?=
e2e-chart: setup
	@test -n "$(E2E_KUBECONFIG)" || { echo "error: no cluster: set KUBECONFIG, or start the harness (its kubeconfig: $(HARNESS_KUBECONFIG))" >&2; exit 1; }
	$(PY) -m tools.e2e_chart --kubeconfig '$(E2E_KUBECONFIG)' $(if $(E2E_CHART_VALUES),--values $(E2E_CHART_VALUES)) -- $(E2E_ARGS)

## e2e-matrix: make e2e on each harness configuration (tools/e2e_matrix.py: default, gates
## off, WorkloadWithJob, 1.36), the harness put back to the default after; results appended to
## $(E2E_MATRIX_RESULTS). MATRIX=a,b: only those.
E2E_MATRIX_RESULTS ?= build/e2e-matrix-results.md
MATRIX ?= a,b,c,d
e2e-matrix: setup
	$(PY) -m tools.e2e_matrix --configs $(MATRIX) --results $(E2E_MATRIX_RESULTS)

## bench-e2e: figures on a real control plane (tools/bench_e2e; prints numbers, not a test):
## A, a gang's time to bound after a disturbance beyond kube-scheduler's own (resume with old
## pods terminating, the reconciler away 15 s, the service down 30 s, a JobSet restart, a
## re-apply), BENCH_E2E_ROUNDS rounds each; B, BENCH_E2E_SIZES TrainJobs: the service's RSS
## and CPU, TrainJob -> PodGroup and pod admission p99, the growth per TrainJob. Written to
## build/bench-e2e.md (and .json). On the shared harness: flock /tmp/harness.lock make bench-e2e.
BENCH_E2E_ROUNDS ?= 6
BENCH_E2E_SIZES ?= 100,1000
BENCH_E2E_ARGS ?=
bench-e2e: setup
	@test -n "$(E2E_KUBECONFIG)" || { echo "error: no cluster: set KUBECONFIG, or start the harness (its kubeconfig: $(HARNESS_KUBECONFIG))" >&2; exit 1; }
	$(PY) -m tools.bench_e2e --kubeconfig '$(E2E_KUBECONFIG)' --rounds $(BENCH_E2E_ROUNDS) --sizes $(BENCH_E2E_SIZES) --out build $(BENCH_E2E_ARGS)

## bench: speed and memory figures (prints numbers; not a test): the planning core, then
## concurrent HTTPS reviews against the service and against a bare uvicorn app, the
## reconciler, feasibility at 100, 1,000 and 10,000 nodes, and gang health (the pod watch's
## memory per gang, the longest loop stall under a burst of 10,000 pod events), gang objects
## first (a burst of TrainJobs: TrainJob -> PodGroup with the condition writer on and off), and
## the watch cache's memory per TrainJob and per foreign PodGroup (10,000 of each)
bench: setup
	$(PY) -m tests.bench.plan_bench
	$(PY) -m tests.bench.admission_bench
	$(PY) -m tests.bench.reconcile_bench
	$(PY) -m tests.bench.feasibility_bench
	$(PY) -m tests.bench.status_bench
	$(PY) -m tests.bench.gang_first_bench
	$(PY) -m tests.bench.cache_bench
	$(if $(BENCH_KUBECONFIG),$(PY) -m tests.bench.reconcile_bench --kubeconfig $(BENCH_KUBECONFIG))

## prometheus: Debian's Prometheus, which tests/test_prometheus.py runs (skipped without it,
## unless REQUIRE_PROMETHEUS=1); installed with apt-get when missing
prometheus:
	@command -v prometheus >/dev/null || { \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }
	@prometheus --version | head -1

## image: the container image (Dockerfile) with docker or podman, whichever has a working engine;
## tagged $(IMAGE):$(TAG), the tag defaulting to the package's version. The base is built from by
## digest: BASE_DIGEST= when given, else the one $(BASE_IMAGE) resolves to now (printed, and kept
## in the image's base.digest label). For $(PLATFORMS) with docker buildx or podman (a manifest
## list; BUILDX_FLAGS=--push to push it), else for this machine's architecture only, said so.
IMAGE ?= trainjob-scheduling-webhook
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
TAG ?= $(VERSION)
SOURCE ?= $(shell git remote get-url origin 2>/dev/null || echo unknown)
ENGINE ?= $(shell for e in docker podman; do command -v $$e >/dev/null 2>&1 && $$e info >/dev/null 2>&1 && { echo $$e; break; }; done)
BASE_IMAGE ?= python:3.11-slim-bookworm
BASE_DIGEST ?=
PLATFORMS ?= linux/amd64,linux/arm64
BUILDX_FLAGS ?=

image:
	@if [ -z "$(ENGINE)" ]; then \
		for e in docker podman; do \
			if command -v $$e >/dev/null 2>&1; then echo "error: $$e is installed but its engine does not answer ($$e info fails)" >&2; \
			else echo "error: $$e is not installed" >&2; fi; \
		done; \
		echo "error: make image needs docker or podman with a working engine" >&2; exit 1; \
	fi
	@set -e; digest='$(BASE_DIGEST)'; \
	if [ -z "$$digest" ]; then \
		$(ENGINE) pull --quiet $(BASE_IMAGE) >/dev/null; \
		digest=$$($(ENGINE) image inspect --format '{{index .RepoDigests 0}}' $(BASE_IMAGE) | sed -n 's/.*@//p'); \
	fi; \
	case "$$digest" in sha256:*) ;; *) echo "error: cannot resolve $(BASE_IMAGE) to a digest (got '$$digest')" >&2; exit 1;; esac; \
	echo "base: $(BASE_IMAGE)@$$digest (BASE_DIGEST=$$digest builds on it again)"; \
	args="--build-arg VERSION=$(VERSION) --build-arg SOURCE=$(SOURCE) --build-arg PYTHON_IMAGE=$(BASE_IMAGE)@$$digest --build-arg BASE_DIGEST=$$digest"; \
	if [ "$(ENGINE)" = podman ]; then \
		echo "building for $(PLATFORMS) with podman, as the manifest list $(IMAGE):$(TAG)"; \
		podman build --platform $(PLATFORMS) $$args --manifest $(IMAGE):$(TAG) .; \
	elif docker buildx version >/dev/null 2>&1; then \
		echo "building for $(PLATFORMS) with docker buildx"; \
		docker buildx build --platform $(PLATFORMS) $$args $(BUILDX_FLAGS) -t $(IMAGE):$(TAG) .; \
	else \
		echo "note: docker has no buildx plugin: building for this machine's architecture only, not $(PLATFORMS)" >&2; \
		docker build $$args -t $(IMAGE):$(TAG) .; \
	fi

## lock: requirements.lock, the image's dependencies pinned with their sha256 hashes (uv, from
## the test extras; resolved for CPython 3.11 on Linux, the image's; needs PyPI)
lock: setup
	$(VENV)/bin/uv pip compile pyproject.toml --generate-hashes --python-version 3.11 \
		--python-platform linux --custom-compile-command "make lock" --no-config --quiet \
		-o requirements.lock

## stamp: the chart's version and appVersion, and the Dockerfile's VERSION default, set to the
## package's (pyproject.toml's version, the one version source)
stamp: setup
	$(PY) -m tools.release --stamp

## release: into dist/: the wheel, the packaged chart, the SBOM of the image's Python
## environment, the kubectl plugin's archive and krew manifest, and SHA256SUMS
## (tools/release.py; RELEASE_URL: where the files will be downloaded from)
RELEASE_URL ?= https://downloads.example.invalid/trainjob-scheduling/v{version}
release: setup
	$(PY) -m tools.release --dist dist --url '$(RELEASE_URL)'

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info site dist build
