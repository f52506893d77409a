# Cairn task runner. `make help` lists the targets.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
MPIRUN := mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root,)

.PHONY: help setup setup-demo build demo wheel test test-rust test-python install bench fuzz lint check clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

setup: ## install system packages, the venv with the test and benchmark tools, and build everything (idempotent)
	@scripts/setup.sh

setup-demo: ## only what the demo needs: the venv with numpy, tqdm (mpi4py where mpicc is) and the extension; no apt
	@scripts/setup_demo.sh

build: ## rebuild the Python extension and the C library after code changes
	$(VENV)/bin/maturin develop --release -q
	cargo build --release -q -p cairn-capi -p cairn-server
	scripts/build_c.sh

demo: setup-demo ## the main job: a local staging cluster; 4 ranks (MPI where mpirun is) write a 3-D field, 3 read boxes back
	$(PY) -m cairn.demo

wheel: ## make wheel [WHEELS=DIR]: a wheel (default target/wheels/) that pip installs without cargo, apt or root
	@scripts/build_wheel.sh $(WHEELS)

test: setup test-rust test-python ## run every test (what CI runs)

test-rust: ## Rust unit, property and integration tests, and the crates' module layers (layers.toml)
	cargo run --release -q -p cairn-layers
	cargo test --release --workspace --exclude cairn-py

test-python: ## the Python package's module layers (layers.toml), then pytest: API, MPI ranks, SIGKILL, C example, CLI
	$(PY) scripts/python_layers.py
	$(PY) -m pytest

install: ## make install PREFIX=DIR: libcairn.so, cairn.h, cairn-server, the cairn command, the Fortran module, pkg-config and CMake files
	scripts/install.sh $(or $(PREFIX),/usr/local)

bench: setup ## benchmarks with same-run baselines; results in bench/results/
	$(PY) -m cairn.bench file
	$(PY) -m cairn.bench staging
	$(PY) -m cairn.bench pack
	$(PY) -m cairn.bench skel
	$(PY) -m cairn.bench dad
	$(PY) -m cairn.bench drain
	$(PY) -m cairn.bench drain-scale
	$(PY) -m cairn.bench stream
	$(PY) -m cairn.bench demo-prefault
	$(PY) -m cairn.bench adios2

fuzz: ## fuzz the frame decoder briefly (nightly + cargo-fuzz; skipped without nightly)
	scripts/fuzz.sh

lint: ## formatting and lints: cargo fmt --check, clippy, ruff, and the _native.pyi stub against the built module
	cargo fmt --all --check
	cargo clippy --workspace --release -q -- -D warnings
	$(VENV)/bin/ruff check python tests
	$(PY) -m mypy.stubtest cairn._native

check: setup lint test-rust test-python ## everything CI runs (setup skips apt when its packages are there)

clean: ## remove build outputs
	cargo clean
	rm -rf $(VENV) .pytest_cache
