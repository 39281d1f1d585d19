# durable-run: the README's commands. Every target installs what it needs first
# (hack/setup.sh is idempotent and takes seconds once done).
PY := .venv/bin/python
SETUP := hack/setup.sh

.PHONY: setup demo tour test lint generate sandbox-up sandbox-down sandbox-status sandbox-image
# The sandbox's node: real (kubelet + containerd, the default where the machine runs it) or process.
NODE_FLAG := $(if $(NODE),--node $(NODE),)
# TOUR=1: the sandbox also runs Kueue and Jaeger (built first; the real node only).
TOUR_FLAG := $(if $(TOUR),--tour,)
TOUR_BINARIES := $(if $(TOUR),hack/build-binaries.sh kueue jaeger)

setup:
	@$(SETUP)

## The main job: the local sandbox and an example run, then tear down (NODE=process for the process node).
demo: setup
	$(TOUR_BINARIES)
	$(PY) -m durablerun_testbed sandbox demo $(NODE_FLAG) $(TOUR_FLAG)

## The demo with every part: Kueue admitting a queue of runs, and the crashed run's trace in Jaeger (their first
## builds take 10-15 minutes more; the README says what each part shows).
tour:
	$(MAKE) demo TOUR=1

## The whole test suite against the real test bed (what CI runs), on TEST_WORKERS pytest workers (2: the suite
## mostly waits on leases, pods and timers; each worker starts its own test bed; a file's tests stay on one worker).
TEST_WORKERS ?= 2
test: setup lint
	hack/build-binaries.sh jaeger kueue  # the tracing tests' collector and the Kueue manager, outside any timeout
	$(PY) -c 'from durablerun_testbed import chromium; chromium.ensure_installed()'  # the browser tests' Chromium
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not long" --ignore=tests/realnode/test_chart_upgrade.py \
		--ignore=tests/realnode/test_interrupted_session.py  # both in faults, as the tests marked long

## ruff and mypy --strict on the code; helm lint --strict and kubeconform (strict, offline) on what users
## apply: the chart rendered with its defaults and with every feature on, deploy/ and its samples.
lint: setup
	hack/build-binaries.sh kubeconform prometheus-operator-crds  # the manifests' linter and its schemas
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/lint-imports --no-cache
	$(PY) hack/lint_manifests.py

generate: setup
	$(PY) hack/generate.py

## What a release publishes, in dist/: wheel and sdist, the chart packaged with its images pinned by digest,
## the images as OCI archives, SHA256SUMS (docs/install.md).
.PHONY: release
release: setup
	$(PY) hack/release.py

## Remove what test sessions killed by SIGKILL left running (their beds' processes, containers, cgroups,
## mounts, bridges, directories); never anything of a session still running. Every test session does it first.
.PHONY: clean
clean:
	$(PY) -m durablerun_testbed reap

sandbox-up: setup
	$(TOUR_BINARIES)
	$(PY) -m durablerun_testbed sandbox up $(NODE_FLAG) $(TOUR_FLAG)

sandbox-down: setup
	$(PY) -m durablerun_testbed sandbox down

sandbox-status: setup
	$(PY) -m durablerun_testbed sandbox status

## Your workflows in an image FROM the runner image, on the sandbox's node: make sandbox-image DIR=path/to/code
sandbox-image: setup
	$(PY) -m durablerun_testbed sandbox image $(DIR)

## Benchmarks against the floors, DBOS and LangGraph (not part of CI; ~20 min, BENCH_QUICK=1 for a smoke run):
## installs what they need (bench/setup.sh), runs every section, writes bench/RESULTS.md.
.PHONY: bench
bench:
	bench/setup.sh
	bench/.venv/bin/python -m durablerun_bench

## The fault suite's long version (docs/faults.md, "Running it": about 3 hours on a quiet 2-core machine):
## >=120 trials of every fault kind (runner SIGKILL, OOM kill, pod deletion, eviction, two operators at once,
## operator SIGKILL, pause past the lease; runs through S3 outages and API server restarts), each with the full
## invariant checks, generated workflows against their oracle (120 per store under SIGKILL; 30 per fault on the
## test bed under runner and operator SIGKILLs, pauses past the lease, S3 outages), and the real node's faults
## (tests/realnode/test_faults.py: 20 runs under the control plane's restart), all in one "fault trials" table,
## and a chart upgrade under waiting runs (tests/realnode/test_chart_upgrade.py: three operator rollouts, too
## long for `make test`, which has the pinning it relies on in tests/realnode/test_pinning.py), and a session
## holding a real node ended by SIGTERM and by SIGKILL (tests/realnode/test_interrupted_session.py).
## The journal reader fuzzed with 5,000 examples per kind of damage (tests/sdk/test_fuzz_journal.py, 150 in `make test`),
## and a local run SIGKILLed at 60 random points per store (tests/sdk/test_kill_resume.py, 8 in `make test`).
## The long versions of two operator checks: a renewal stall of 40 runs on a 30 s lease (tests/operator/test_overload.py,
## 20 on a 20 s lease in `make test`), and the ingress's rate-limit table's memory traced over a million keys
## (tests/operator/test_webhook_limits.py, the first 200,000 in `make test`).
## CI runs the bounded version as part of `make test`. FAULT_SEED=<n> replays the random timings of a failure.
.PHONY: faults
faults: setup
	FAULT_TRIALS=$${FAULT_TRIALS:-120} FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-5000} \
	DURABLERUN_KILL_EXAMPLES=$${DURABLERUN_KILL_EXAMPLES:-60} $(PY) -m pytest tests/faults \
		tests/realnode/test_faults.py tests/realnode/test_chart_upgrade.py tests/realnode/test_interrupted_session.py \
		tests/sdk/test_fuzz_journal.py tests/security/test_fuzz_ingress.py tests/badinput/test_fuzz_admission.py tests/sdk/test_kill_resume.py \
		tests/operator/test_overload.py tests/operator/test_webhook_limits.py tests/operator/test_schedule_restarts.py \
		-p no:cacheprovider -rA --timeout=5400
