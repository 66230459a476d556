# Two commands on a fresh machine:
#   make simulate   replay the built-in workload through the placement engine (table + plot)
#   make test       the whole test suite (lint, types, unit, integration on a real control plane)
.PHONY: simulate test bootstrap k8s-binaries

bootstrap:
	scripts/bootstrap.sh

simulate: bootstrap
	mkdir -p out
	.venv/bin/egpu simulate --json out/simulate.json --plot out/simulate.png

test:
	scripts/test.sh

k8s-binaries:
	hack/ensure-k8s.sh
