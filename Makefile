# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip
# torch is pinned: installed first, then every later pip call is constrained to it.
CONSTRAINTS := constraints.txt

.PHONY: demo test test-fast test-slurm slurm-deps venv clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PY) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	@# .[all]: the core and every extra (service, ray, slurm, nvml, execute) plus the test tools.
	$(PIP) install --quiet -c $(CONSTRAINTS) -e ".[all]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpualloc demo

test: $(STAMP)
	@# In CI (CI set), install Slurm first when this machine can, so the tests marked slurm run there too;
	@# elsewhere, and where it cannot, they skip with their reason.
	@if [ -n "$$CI" ]; then $(MAKE) --no-print-directory slurm-deps || echo "make test: Slurm not installed: its tests skip"; fi
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q

# The everyday loop: ruff and every test not marked slow (the demo, Slurm, Ray, gloo workers, training,
# reproduce). `make test` (and CI) still run everything.
test-fast: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q -m "not slow"

# The tests against a real Slurm (a fake cluster on this host; see scripts/slurm/fake-cluster.sh).
SLURM_PKGS := slurm-wlm munge
slurm-deps:
	@have() { command -v "$$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$$1" ]; }; \
	if ! have slurmctld || ! have slurmd || ! have munged; then \
	    if [ "$$(id -u)" = 0 ]; then SUDO=; \
	    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; \
	    else echo "slurm-deps: Slurm is not installed; as root run: apt-get install -y --no-install-recommends $(SLURM_PKGS)"; exit 2; fi; \
	    timeout 600 $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 $$SUDO apt-get install -y -qq --no-install-recommends $(SLURM_PKGS); \
	fi

test-slurm: $(STAMP) slurm-deps
	$(BIN)/python -m pytest -q -m slurm tests/slurm

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
