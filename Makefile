# The two commands of the README:
#   make demo   set up, then run the JAX benchmark workload with the sidecar, show what it exports, and write
#               the run's report (run/demo/report/index.html) from the events it recorded
#   make test   set up (Python environment, Debian's prometheus, prometheus-alertmanager and chromium), then test
# Everything else here is a step of those two.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test perf fleet-scale hang-trials straggler-trials image setup system-deps lint lock generate clean

demo: setup
	rm -rf run/demo  # a fresh run each time: the workload resumes from checkpoints it finds
	$(BIN)/tpuscope workload --steps 300 --run-dir run/demo --record run/demo/events.jsonl
	$(BIN)/tpuscope report --recording run/demo/events.jsonl --out run/demo/report

# pytest-xdist: each test file whole on one worker (its module fixtures start once), the files marked `long` first
# (tests/conftest.py), one worker more than the cores because part of the suite waits on real time. The tests marked
# `alone` (the multi-host jobs, the every-panel board test) then run with nothing beside them: beside the pool they
# starved the timing-sensitive tests and the device profiler. Durations: docs/development.md.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: setup system-deps lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not alone and not trials"
	$(BIN)/python -m pytest -m "alone and not trials"

# tpuscope's own cost against its targets, beside its peers (docs/performance.md): a table and run/perf.json.
perf: setup system-deps
	$(BIN)/tpuscope bench perf --json run/perf.json

# The rules, the boards and Prometheus' storage at 64, 256 and 1,000 hosts, beside node-exporter-mixin's rules
# when PEER_RULES names them rendered (docs/fleet.md, "A thousand hosts"): most of an hour on 2 cores.
FLEET_HOSTS ?= 64,256,1000
BOARD_HOURS ?= 24,24,6
fleet-scale: setup system-deps
	$(BIN)/tpuscope bench fleet-scale --fleet-hosts $(FLEET_HOSTS) --board-hours $(BOARD_HOURS) \
	  $(if $(PEER_RULES),--peer-rules $(PEER_RULES)) --json run/fleet-scale.json

# A 4-process job whose worker 1 hangs three ways, 10 trials each, at the deployed speed, and the slow clean runs
# that must not page, with a real Prometheus on the rules (docs/failures.md, "A hung job"): about 45 minutes.
hang-trials: setup system-deps
	$(BIN)/tpuscope bench hangs --trials 10 --json run/hangs.json

# What a straggler costs, measured on a 4-process job against its own device profiles and timers: a slow chip named
# by the profiles on one Prometheus and a central one, and a blip (docs/bench.md, "What a straggler costs"). Each
# prints its figures; `make test` keeps the slow input's run, which names and costs a straggler too.
straggler-trials: setup system-deps
	$(BIN)/python -m pytest -m trials -s

# The sidecar image (deploy/image/Containerfile), made from Debian's packages and the wheel, with no base image
# or registry needed: localhost/tpuscope:VERSION, or deploy/image/build.sh NAME:TAG. docs/fleet.md.
image: setup
	deploy/image/build.sh

setup: $(VENV)/.installed

# Every version pinned by constraints.txt, so CI tests what was tested here: an upstream release changes nothing
# until `make lock` takes it (tests/test_versions.py says when the environment holds something unpinned).
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,jax,tpu,gpu,dashboards,report]'
	touch $@

# After a change to pyproject.toml's dependencies: install the newest that satisfy them, and pin what was installed.
lock:
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,jax,tpu,gpu,dashboards,report]'
	{ sed -n '1,2p' constraints.txt; $(BIN)/python -m pip freeze --all --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	touch $(VENV)/.installed

# Real Prometheus, promtool, Alertmanager and amtool for the tests, node_exporter as the benchmark's peer,
# and headless Chromium to open the run reports as a person would (Debian's packages; they start no service).
system-deps:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null && \
	  command -v prometheus-alertmanager >/dev/null && command -v amtool >/dev/null && \
	  command -v prometheus-node-exporter >/dev/null && command -v chromium >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    prometheus prometheus-alertmanager prometheus-node-exporter chromium fonts-dejavu-core; }
	@# kubectl renders the Kustomize overlays (kubectl kustomize); Debian's, where the machine has none of its own.
	@command -v kubectl >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends kubernetes-client; }
	@# VictoriaMetrics (victoria-metrics, vmagent, vmalert) runs the rules beside Prometheus (tests/test_victoriametrics.py).
	@command -v vmalert >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends victoria-metrics; }
	@# podman builds and runs the sidecar image (tests/test_image.py; iptables publishes its port); mmdebstrap
	@# unpacks its Debian base.
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v mmdebstrap >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends podman runc iptables mmdebstrap; }

# Style, types, and the rooms' import contracts (pyproject.toml, [tool.importlinter]).
lint: setup
	$(BIN)/ruff check tpuscope tests
	$(BIN)/ruff format --check tpuscope tests
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# Rewrite the committed generated files (docs/metrics.md, ...) after changing what they come from.
generate: setup
	$(BIN)/tpuscope generate

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
