VENV ?= .venv
PY = $(VENV)/bin/python
PYTHON3 ?= python3

# Everything is installed by pip into $(VENV); this stamp says it is done for this pyproject.toml.
SETUP_STAMP = $(VENV)/.setup-stamp

# The generated protobuf code (gwtf/v1/*_pb2*.py, *.pyi) is committed, so that `pip install .`,
# a wheel and an sdist carry it with no build step; `make proto` regenerates it after a .proto
# changes, and tests/unit/test_proto.py fails while the committed code differs from what protos/
# generates with the pinned grpcio-tools.
PROTOS := $(sort $(shell find protos -name '*.proto' 2>/dev/null))

# torch==2.13.0 is installed on its own and first: this machine keeps a CPU build of it in
# /opt/wheels (pip's config already points there; the flag only makes it explicit), whereas a
# bare range in pyproject.toml would pull a multi-GB CUDA build from the index.
TORCH_PIN = torch==2.13.0
TORCH_FIND_LINKS = $(if $(wildcard /opt/wheels/torch-*.whl),--find-links /opt/wheels)

LINT_PATHS = $(wildcard gwtf tests benchmarks)

.DEFAULT_GOAL := help
.PHONY: help setup proto lint test soak bench demo clean distclean

help:
	@echo "make setup   create $(VENV) and install gwtf[dev] into it"
	@echo "make proto   regenerate gwtf/v1/*_pb2*.py(i) from protos/"
	@echo "make lint    ruff on gwtf tests benchmarks; mypy (strict) on the typed packages"
	@echo "make test    setup, lint, then the whole pytest suite but the soak test"
	@echo "make soak    setup, then the soak tests: a local cluster trains under 30 minutes of churn"
	@echo "             (40-80 min in all; GWTF_SOAK_S=300 make soak churns for 5)"
	@echo "make bench   setup, then python -m benchmarks"
	@echo "make demo    setup, then gwtf demo"
	@echo "make clean   remove caches and build outputs (keeps $(VENV)); distclean also removes it"

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install $(TORCH_FIND_LINKS) '$(TORCH_PIN)'
	$(PY) -m pip install -e '.[dev]'
	touch $@

proto: $(SETUP_STAMP)
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)

# The packages whose every function is typed (strict mypy overrides in pyproject.toml).
TYPED = $(wildcard gwtf/flow gwtf/job gwtf/train gwtf/recovery gwtf/sim gwtf/node gwtf/client.py gwtf/live.py gwtf/local)

lint: setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/mypy $(TYPED)

# Two workers, each taking whole files (--dist loadfile): most of the suite's time is real node
# processes waiting on failure timeouts and emulated compute, so one worker left a core idle
# (15m56s of user time in a 17m22s run); whole files, because the chaos cases of a file share one
# swarm in order. On a 2-core machine with other work running, 673 s against 950 s for one worker.
PYTEST_WORKERS ?= 2

test: setup lint
	$(PY) -m pytest -m "not soak" -n $(PYTEST_WORKERS) --dist loadfile

# Half an hour of churn on a local cluster (GWTF_SOAK_S seconds of it): too long for every
# `make test`. -s: the soak prints the job's progress as it goes, and its figures at the end.
GWTF_SOAK_S ?= 1800

soak: setup
	GWTF_SOAK_S=$(GWTF_SOAK_S) $(PY) -m pytest -m soak -s

bench: setup
	$(PY) -m benchmarks

demo: setup
	$(VENV)/bin/gwtf demo

clean:
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
