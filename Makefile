# Two commands for a fresh machine (Python 3.10+ and make):
#   make train   set up .venv, train on the built-in toy corpus, show translations and test BLEU
#   make test    set up .venv with the dev tools, run ruff, mypy and the tests
# `make lint` runs ruff alone (lint and format check), `make typecheck` mypy alone ([tool.mypy] in
# pyproject.toml), with the same set-up as `make test`.
# Where no NVIDIA GPU is visible, torch is installed as $(TORCH_CPU) first, from pip's configured
# index (a CPU wheel where that index has one, as on this project's machines). PyPI's own Linux
# torch wheels are CUDA builds of several GB: there, set TORCH_INDEX=https://download.pytorch.org/whl/cpu
# to get the CPU build from PyTorch's index.
# `make clean` removes the virtual environment and data/cache, never downloads or trained runs.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_CPU ?= torch==2.13.0
TORCH_INDEX ?=
RUN_DIR ?= runs/toy
TOY_TEST := data/cache/toy-v3-seed1234-20000-500-500-src-trg/test

M30K_DIR ?= runs/multi30k_de_en
M30K_MINUTES ?= 60
BASE_URL ?=

.PHONY: train test typecheck test-slow test-cluster test-gpu test-browser multi30k lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "no GPU found: installing the CPU build of torch ($(TORCH_CPU))"; \
		$(BIN)/pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_CPU)"; \
	fi
	$(BIN)/pip install -q -e .
	touch $@

# The test set-up installs the optional extras too, so that their tests run.
$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q -e ".[dev,ct2,serve,mtdata,hf,documents,text]"
	touch $@

train: $(VENV)/.installed
	$(BIN)/mt train --run-dir $(RUN_DIR)
	@echo "--- a few test translations (beam 4) ---"
	@head -n 5 $(TOY_TEST).src > $(RUN_DIR)/sample.src
	@$(BIN)/mt translate --checkpoint $(RUN_DIR)/best.pt --input $(RUN_DIR)/sample.src --output $(RUN_DIR)/sample.hyp
	@paste -d '\n' $(RUN_DIR)/sample.src $(RUN_DIR)/sample.hyp | sed 'n;s/^/    -> /'
	@echo "--- test set scores ---"
	$(BIN)/mt evaluate --checkpoint $(RUN_DIR)/best.pt --src $(TOY_TEST).src --ref $(TOY_TEST).trg

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy transformer_mt

test: lint typecheck
	$(BIN)/pytest -q

test-slow: $(VENV)/.installed-dev
	$(BIN)/pytest -q -m slow

# Several machines played by torchrun agents on 127.0.0.1 (docs/CLUSTER.md): the 2-node run, a
# late and a missing node, a killed worker restarted from last.pt; and the cluster scripts.
test-cluster: $(VENV)/.installed-dev
	$(BIN)/pytest -q -m "slow or not slow" -rs tests/test_multinode.py

# The GPU code paths (NCCL, bf16, torch.compile on CUDA); each test skips, saying so, without a GPU.
test-gpu: $(VENV)/.installed-dev
	$(BIN)/pytest -q -m gpu -rs

# The translation page in a real headless Chromium (tests/test_page.py; writes
# docs/translation_page.png): Debian's chromium and chromium-driver, installed with apt-get when
# missing and root, driven by selenium (no browser download). Without them the test skips, saying why.
$(VENV)/.installed-browser: $(VENV)/.installed-dev
	$(BIN)/pip install -q -e ".[dev,ct2,serve,mtdata,hf,documents,text,browser]"
	touch $@

test-browser: $(VENV)/.installed-browser
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver \
				|| echo "apt-get could not install chromium: the browser test will skip"; \
		else echo "no chromium/chromedriver (install them as root: apt-get install chromium chromium-driver)"; fi; \
	fi
	$(BIN)/pytest -q -m browser -rs

# The CPU benchmark recipe (docs/BENCHMARKS.md): Multi30k de->en, M30K_MINUTES of training, then
# test_2016_flickr BLEU (beam 5) of best.pt, last.pt and average.pt.
# BASE_URL= a mirror of the Multi30k files.
multi30k: $(VENV)/.installed
	$(BIN)/mt train --config configs/multi30k_de_en.yaml --run-dir $(M30K_DIR) \
		--set train.max_minutes=$(M30K_MINUTES) $(if $(BASE_URL),--set data.base_url=$(BASE_URL))
	for c in best last average; do echo "--- $$c.pt"; $(BIN)/mt evaluate --checkpoint $(M30K_DIR)/$$c.pt \
		--src data/multi30k/test_2016_flickr.de --ref data/multi30k/test_2016_flickr.en; done

format: $(VENV)/.installed-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) data/cache .pytest_cache .ruff_cache .mypy_cache
