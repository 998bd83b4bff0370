# Every target sets up its own virtualenv first, so each works on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SAMPLES := webhook/samples

CERT_DIR ?= certs
SERVE_ARGS ?=

.PHONY: setup test lint format typecheck unit docs docs-serve run certs plan bench prometheus image clean

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
	$(PY) -m ruff check webhook tests docs
	$(PY) -m ruff format --check webhook tests docs
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
	$(PY) -m ruff format webhook tests docs
	$(PY) -m ruff check --fix webhook tests docs

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

## bench: speed and memory figures (prints numbers; not a test): the planning core, then
## concurrent HTTPS reviews against the service and against a bare uvicorn app, the
## reconciler, feasibility at 100, 1,000 and 10,000 nodes, and gang health (the pod watch's
## memory per gang, the longest loop stall under a burst of 10,000 pod events), and the watch
## cache's memory per TrainJob and per foreign PodGroup (10,000 of each)
bench: setup
	$(PY) -m tests.bench.plan_bench
	$(PY) -m tests.bench.admission_bench
	$(PY) -m tests.bench.reconcile_bench
	$(PY) -m tests.bench.feasibility_bench
	$(PY) -m tests.bench.status_bench
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
## tagged $(IMAGE):$(TAG), the tag defaulting to the package's version
IMAGE ?= trainjob-scheduling-webhook
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
TAG ?= $(VERSION)
SOURCE ?= $(shell git remote get-url origin 2>/dev/null || echo unknown)
ENGINE ?= $(shell for e in docker podman; do command -v $$e >/dev/null 2>&1 && $$e info >/dev/null 2>&1 && { echo $$e; break; }; done)

image:
	@if [ -z "$(ENGINE)" ]; then \
		for e in docker podman; do \
			if command -v $$e >/dev/null 2>&1; then echo "error: $$e is installed but its engine does not answer ($$e info fails)" >&2; \
			else echo "error: $$e is not installed" >&2; fi; \
		done; \
		echo "error: make image needs docker or podman with a working engine" >&2; exit 1; \
	fi
	$(ENGINE) build --build-arg VERSION=$(VERSION) --build-arg SOURCE=$(SOURCE) -t $(IMAGE):$(TAG) .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info site
