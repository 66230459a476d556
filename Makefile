# Two commands on a fresh machine:
#   make simulate   replay the built-in workload through the placement engine (table + plot)
#   make test       the whole test suite (lint, types, unit, integration on a real control plane);
#                   EGPU_TEST_WORKERS=N sets its pytest-xdist workers (default 2, 1 = serial)
# After editing charts/elastic-gpu:  make deploy  (re-renders deploy/ from it; a test checks)
.PHONY: simulate test bootstrap k8s-binaries deploy gpu-check

bootstrap:
	scripts/bootstrap.sh

simulate: bootstrap
	mkdir -p out
	.venv/bin/egpu simulate --json out/simulate.json --plot out/simulate.png

test:
	scripts/test.sh

# On a machine with an NVIDIA GPU: our NVML, MIG, MPS and DRA paths against nvidia-smi
# (docs/gpu-check.md). Read only; ARGS=--allow-mig-changes on your own machine only.
gpu-check: bootstrap
	.venv/bin/egpu gpu-check $(ARGS)

k8s-binaries:
	hack/ensure-k8s.sh

# deploy/ is `helm template` of charts/elastic-gpu (hack/render-deploy.py; tests/unit/chart checks it).
deploy:
	EGPU_K8S_BIN_DIR=$$(hack/ensure-k8s.sh | tail -n 1) PYTHONPATH=src \
	  $$(test -x .venv/bin/python && echo .venv/bin/python || echo python3) hack/render-deploy.py
