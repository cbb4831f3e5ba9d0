# The two commands: `make run` (a rollout on local hosts) and `make test` (lint + the suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-long test-stress test-cluster test-slurm test-ray lint bench bench-scale soak load format clean docs docs-serve

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstalled whenever pyproject.toml changes.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --editable .
	touch $@

# torch is pinned for the tests: on the project's machines that release is a CPU build already
# on disk (an unpinned torch pulls a multi-GB CUDA build); set TORCH= to choose another.
TORCH ?= torch==2.13.0

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --editable '.[test]' $(TORCH)
	touch $@ $(VENV)/.installed-run

$(VENV)/.installed-ray: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --editable '.[test,ray]' $(TORCH)
	touch $@ $(VENV)/.installed-test $(VENV)/.installed-run

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --editable '.[bench,plot]'
	touch $@

$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --editable '.[docs]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/envserver --log-level WARNING rollout CartPole-v1 --num-envs 8 --steps 2000

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two workers (pytest-xdist). tests/conftest.py keeps each file on one worker in file order, and
# starts the tests marked slow first, each on its own; tests of several files that share a fixed
# resource carry one xdist_group mark. TEST_WORKERS=0 runs the suite in this one process. The
# slowest 15 are listed at the end: the suite must stay well under 10 minutes on 2 cores.
TEST_WORKERS ?= 2

test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15

# The whole programs, marked long (CI runs them after make test): every example of the README and
# the docs, the example trainers, the benchmark's quick run, and the short chaos, load and scale
# soaks. Several minutes on 2 cores.
test-long: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m long -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15

# Not in CI: the suite STRESS_RUNS times with STRESS_LOAD busy loops beside it, to find the tests
# that fail by chance on a busy machine (tests/harness/stress.py lists them). STRESS_ARGS are
# pytest's:
#   make test-stress STRESS_RUNS=1 STRESS_ARGS="tests/host/test_security.py --count 20"
STRESS_RUNS ?= 3
STRESS_LOAD ?= 2
STRESS_ARGS ?= -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test-stress: $(VENV)/.installed-test
	$(BIN)/python tests/harness/stress.py --runs $(STRESS_RUNS) --load $(STRESS_LOAD) -- $(STRESS_ARGS)

# The Compose cluster for real (needs Docker and Compose v2; .ci/provision-docker sets them up).
test-cluster: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m cluster --timeout 900 tests/cluster

# Slurm for real: the sbatch scripts of deploy/slurm/ on three nodes (root: .ci/provision-slurm
# installs Slurm from Debian and starts a controller and three nodes, each a network namespace).
test-slurm: $(VENV)/.installed-test
	bash .ci/provision-slurm
	$(BIN)/python -m pytest -m slurm --timeout 900 tests/cluster/test_slurm.py

# Ray for real: hosts as actors on a Ray cluster of a head and three worker nodes in one process,
# and on one started with `ray start --head` (installs the ray extra).
test-ray: $(VENV)/.installed-ray
	$(BIN)/python -m pytest -m ray --timeout 600 tests/cluster/test_ray.py

# Several minutes: every vector env side by side, interleaved; writes benchmarks/results/*.md
# and a chart of each (*.png). Anywhere else, `envserver bench` writes them into the current
# directory.
bench: $(VENV)/.installed-bench
	$(BIN)/envserver bench --out benchmarks/results/bench-$$(date +%Y%m%d-%H%M%S).md

# One trainer on 1, 4, 16 and 64 hosts, each in a network namespace of its own, beside the raw
# floor (root: ip netns); writes benchmarks/results/scale-*.md. See docs/scaling.md.
bench-scale: $(VENV)/.installed-test
	$(BIN)/python benchmarks/scale.py

# Minutes of faults (kills, freezes, restarts, cut links) under a rollout, every step accounted
# for; and 50 trainers with a hostile client on one host. Their short versions run in make test.
SOAK_MINUTES ?= 5
soak: $(VENV)/.installed-test
	$(BIN)/python tests/harness/chaos.py --minutes $(SOAK_MINUTES)

load: $(VENV)/.installed-test
	$(BIN)/python tests/harness/load.py --trainers 50 --seconds 60

# The documentation site (mkdocs.yml) in site/, strictly: a broken link or anchor, a page left
# out of the nav, a docstring griffe cannot read or a cross-reference to nothing fails it. The
# API pages come from the docstrings, the command line's from its parsers (docs/hooks/).
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The site at http://127.0.0.1:8000, rebuilt as the pages change.
docs-serve: $(VENV)/.installed-docs
	$(BIN)/mkdocs serve

format: $(VENV)/.installed-test
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info build
