# gpu-efficiency-operator — developer entry points. `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
CLUSTER := hack/localcluster/cluster.sh
export GPUEFF_STATE_DIR ?= /tmp/gpueff-localcluster
KUBECONFIG_LOCAL := $(GPUEFF_STATE_DIR)/kubeconfig
CRD_FILE := crds/gpuefficiency.io_gpuefficiencypolicies.yaml
# e2e tests run on this many pytest-xdist workers, each with a local cluster of its own (most of an
# e2e test is waiting for cycles, so two side by side fit on 2 cores); 0 runs them one by one.
E2E_WORKERS ?= 2
E2E_RERUNS ?= 1

.PHONY: help venv deps proto docs crds lint typecheck importlint unit e2e chaos test demo cluster-up cluster-down build-cluster bench bench-faults clean image image-proof

help:
	@echo "make demo          run the demo on the local cluster (builds it the first time)"
	@echo "make test          lint, type-check, unit tests, then e2e tests on the local cluster"
	@echo "make chaos         the fault-injection e2e tests alone (issue 19), printing their table"
	@echo "make image         build the image with docker, podman or buildah (the first on PATH; ENGINE=... to choose)"
	@echo "make image-proof   build the Dockerfile with buildah here and run the image as its non-root user"
	@echo "make unit | e2e | lint | crds | cluster-up | cluster-down | bench | bench-faults"

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

venv: $(VENV)/.installed
# The operator and, beside it, the test and demo harness (harness/: simulator, scenario runner, demo),
# which the operator image never contains.
$(VENV)/.installed: pyproject.toml harness/pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e '.[dev]' -e harness
	touch $@

deps: venv
	@command -v openssl >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl)
	@command -v faketime >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime)
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

crds: venv
	$(VPY) -m gpu_efficiency.cli crd > $(CRD_FILE)
	mkdir -p charts/gpu-efficiency-operator/crds
	cp $(CRD_FILE) charts/gpu-efficiency-operator/crds/

proto: venv
	$(VPY) -m grpc_tools.protoc -I operator --python_out=operator operator/gpu_efficiency/agent/proto/podresources.proto

docs: crds
	$(VPY) -m gpu_efficiency.api.reference docs/policies.md
	$(VPY) -m gpu_efficiency.config docs/cli.md

lint: venv
	$(VENV)/bin/ruff check operator harness tests bench
	$(VENV)/bin/ruff format --check operator harness tests bench
	$(VENV)/bin/vulture

typecheck: venv
	$(VENV)/bin/mypy

importlint: venv
	$(VENV)/bin/lint-imports

unit: venv
	$(VPY) -m pytest tests/unit -q -n 2

# VictoriaMetrics (tests/e2e/test_victoriametrics_e2e.py) is built beside the rest: a cache of its
# own (hack/localcluster/build-victoriametrics.sh), so a cold machine pays it in parallel, once.
build-cluster: deps
	hack/localcluster/build-victoriametrics.sh & hack/localcluster/build.sh; st=$$?; wait $$! || st=1; exit $$st

cluster-up: deps
	$(CLUSTER) up

cluster-down:
	$(CLUSTER) down

# A failed end-to-end test runs once more (E2E_RERUNS) before it fails the suite: 140 tests of real
# processes on 2 shared cores hit the odd late cycle. Both runs are reported (-rR lists every rerun
# with its first failure), so a flaky test is seen, and a test that fails twice still fails.
e2e: deps build-cluster
	$(VPY) -m pytest tests/e2e -q -m e2e -n $(E2E_WORKERS) --dist worksteal --durations=25 \
		--reruns $(E2E_RERUNS) --reruns-delay 5 -raR

# The fault-injection tests alone (they are part of e2e too), with their table printed (-s).
chaos: deps build-cluster
	$(VPY) -m pytest tests/e2e/test_chaos_e2e.py -q -m e2e -s

# The image proof (`make image-proof`: ~40 s warm, ~10 min the first time on a machine, for the
# debootstrap'ed base) is a target of its own: cold it would take `make test` past its hour.
test: lint typecheck importlint unit e2e

demo: deps build-cluster
	$(VPY) -m gpu_efficiency_sim demo

bench: venv
	$(VPY) bench/engine_bench.py

# Fault-to-taint latency on a cluster of its own (its state dir and ports; torn down afterwards).
bench-faults: deps build-cluster
	GPUEFF_STATE_DIR=/tmp/gpueff-faultbench $(VPY) bench/fault_latency.py

# The image, with whichever engine is on PATH (docker, podman, buildah). IMAGE_PLATFORMS=linux/arm64
# (or both, with docker buildx) for Grace nodes: the image is pure Python on python:3.11-slim, which
# is multi-arch, but only linux/amd64 has been built and run by the project (docs/install.md, "Install").
# docker only where its daemon answers (a docker CLI alone cannot build).
ENGINE ?= $(shell if docker info >/dev/null 2>&1; then echo docker; \
  else for e in podman buildah docker; do command -v $$e >/dev/null && { echo $$e; break; }; done; fi)
IMAGE_NAME ?= gpu-efficiency-operator:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_PLATFORMS ?=
image:
	@test -n "$(ENGINE)" || { echo "make image: none of docker, podman, buildah is on PATH"; exit 1; }
	$(if $(filter buildah,$(ENGINE)),buildah bud,$(ENGINE) build) $(if $(IMAGE_PLATFORMS),--platform $(IMAGE_PLATFORMS)) -t $(IMAGE_NAME) .

# Proof that the Dockerfile builds and the image runs (buildah, no daemon, no registry): see the script.
image-proof:
	hack/image-proof.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
