# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip
# torch is pinned: installed first, then every later pip call is constrained to it.
CONSTRAINTS := constraints.txt

.PHONY: demo test test-slurm venv clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PY) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -c $(CONSTRAINTS) -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpualloc demo

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q

# The tests against a real Slurm (a fake cluster on this host; see scripts/slurm/fake-cluster.sh).
SLURM_PKGS := slurm-wlm munge
test-slurm: $(STAMP)
	@have() { command -v "$$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$$1" ]; }; \
	if ! have slurmctld || ! have slurmd || ! have munged; then \
	    if [ "$$(id -u)" = 0 ]; then SUDO=; \
	    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; \
	    else echo "test-slurm: Slurm is not installed; as root run: apt-get install -y --no-install-recommends $(SLURM_PKGS)"; exit 2; fi; \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(SLURM_PKGS); \
	fi
	$(BIN)/python -m pytest -q -m slurm tests/slurm

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
