# Two commands on a fresh machine:  `make demo` (set up + run the demo workflow)  and  `make test`.
VENV ?= .venv
CORES ?= 2
SHELL := /bin/bash
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup setup-test setup-lint demo test lint format bench clean-demo

setup:
	@bash scripts/setup.sh

setup-test:
	@bash scripts/setup.sh --slurm

# the linters alone (pinned in pyproject.toml's lint extra): no torch, no SLURM
setup-lint:
	@bash scripts/setup.sh --lint

demo: setup
	snakemake --cores $(CORES)

# one worker per core (pytest-xdist), one thread each: each test file whole on one worker, every SLURM test on one
# worker (tests/conftest.py); the time per test file is printed at the end
test: setup-test
	OMP_NUM_THREADS=1 python -m pytest -n $(CORES) --dist loadfile

# ruff's and snakefmt's settings are in pyproject.toml ([tool.ruff], [tool.snakefmt]); CI runs `make lint` first
LINTED := pmlm tests bench scripts workflow/lib
SNAKEFILES := Snakefile workflow/rules
lint: setup-lint
	ruff check $(LINTED)
	ruff format --check $(LINTED)
	snakefmt --check $(SNAKEFILES)

format: setup-lint
	ruff check --fix $(LINTED)
	ruff format $(LINTED)
	snakefmt $(SNAKEFILES)

bench: setup
	python bench/bench_tokenize.py

clean-demo:
	rm -rf results/demo logs/demo benchmarks/demo resources/sources .snakemake
