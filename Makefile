# sglang-ddtree developer commands. PYTHON may point at any interpreter (default python3).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# The CPU machines this project tests on install torch from a local CPU wheel; a machine that
# already has torch (a GPU host, the docker image) keeps its own.
TORCH_SPEC ?= torch==2.13.0

.PHONY: help install install-plugin install-serve run test test-gpu test-gpu-lanes test-gpu-core lint format bench bench-step bench-serving demo train-pair upstream-patch fork

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 18

# A CUDA machine is one where `nvidia-smi -L` lists a GPU; GPU=1 or GPU=0 overrides the check.
ifndef GPU
GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
endif

# On a CUDA machine: SGLang 0.5.17 with its CUDA stack (the serve extra), the plugin and the test
# tools. Elsewhere: the plugin and the test tools (torch from the machine, else TORCH_SPEC).
# pip prints what it fetches: the SGLang install downloads several GB.
install:  ## the package, editable, with its test tools; with SGLang 0.5.17 on a CUDA machine (GPU=0/1)
ifeq ($(GPU),1)
	@echo "make install: CUDA GPU found: installing SGLang 0.5.17 and its CUDA stack (.[serve,test]); several GB, minutes on a fast network"
	$(PIP) install -e ".[serve,test]"
else
	@echo "make install: no CUDA GPU (nvidia-smi -L lists none): installing the plugin and its CPU test tools (.[test]); SGLang is left out"
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e ".[test]"
endif

# The plugin alone on a machine that already has SGLang 0.5.17 (the serving image, the GPU runs):
# the same install step everywhere, editable, no dependency touched.
install-plugin:  ## the plugin alone where SGLang 0.5.17 is installed (no dependency touched)
	$(PIP) install --no-deps --no-build-isolation -e .

# GPU host with network: SGLang 0.5.17 and its CUDA stack (what `make install` does there).
install-serve:  ## SGLang 0.5.17 and its CUDA stack, with the plugin
	$(PIP) install -e ".[serve,test]"

# The main job: a DDTREE server on the shipped trained pair (or MODEL with its drafter DRAFT) at
# http://127.0.0.1:30000/v1; the CPU demo where no GPU or SGLang is available.
run:  ## the main job: a DDTREE server (MODEL=, DRAFT=, ARGS=); the CPU demo without a GPU
	@if [ -n "$(MODEL)" ] && [ -z "$(DRAFT)" ]; then \
		echo "make run: MODEL=$(MODEL) needs DRAFT=<its DFlash drafter> (a local folder or hub id), e.g. make run MODEL=/models/target DRAFT=/models/target-dflash" >&2; exit 2; fi
	@if [ -z "$(MODEL)" ] && [ -n "$(DRAFT)" ]; then \
		echo "make run: DRAFT=$(DRAFT) needs MODEL=<its target>; give neither to serve the shipped pair" >&2; exit 2; fi
	$(PYTHON) -m sglang_ddtree.serve $(if $(MODEL),--model-path $(MODEL) --speculative-draft-model-path $(DRAFT)) $(ARGS)

test:  ## the tests (GPU tests skip themselves without CUDA)
	$(PYTHON) -m pytest test/srt -q

test-gpu:  ## every gpu test (a CUDA machine with SGLang)
	$(PYTHON) -m pytest test/srt -m gpu -v

# The same suite as lanes side by side on one GPU, in sets that each fit a 10-minute command
# (test/gpu_suite.lanes): make test-gpu-lanes SET=1 OUT=/tmp/gpu, then SET=2.
test-gpu-lanes:  ## the gpu tests as parallel lanes on one GPU, one set (SET=1|2, OUT=DIR)
	OUT=$(OUT) test/gpu_suite.sh $(SET)

# The gpu tests without the long server checks (the law against the non-speculative server,
# faults and load, the request fuzzer, the moving-memory sentinels): the kernels, CUDA graphs,
# the tiny-pair end-to-end suite and the README's first request.
test-gpu-core:  ## the gpu tests without the law, fault-and-load, fuzz and sentinel server checks
	$(PYTHON) -m pytest test/srt -m gpu -v --ignore test/srt/test_law_vs_nospec.py \
		--ignore test/srt/test_faults_e2e.py --ignore test/srt/test_fuzz.py \
		--ignore test/srt/test_workspace_guard.py

lint:  ## ruff check and format check
	$(PYTHON) -m ruff check python test benchmark upstream/generate.py upstream/smoke_in_tree.py upstream/smoke_series.py upstream/fork.py
	$(PYTHON) -m ruff format --check python/sglang_ddtree/core python/sglang_ddtree/demo.py benchmark test/srt \
		upstream/generate.py upstream/smoke_in_tree.py upstream/smoke_series.py upstream/fork.py

format:  ## ruff format and fix
	$(PYTHON) -m ruff format python test benchmark
	$(PYTHON) -m ruff check --fix python test benchmark

bench:  ## the core's step time (bench_core.json)
	$(PYTHON) benchmark/ddtree/bench_core.py --out bench_core.json

# In SGLang on a CUDA machine: step cost + accept lengths (pair, 8B shape), serving benchmark.
bench-step:  ## decode-step cost and accept lengths inside SGLang (a GPU)
	$(PYTHON) benchmark/ddtree/bench_step.py --model pair --phases accept,step --out bench_out
	$(PYTHON) benchmark/ddtree/bench_step.py --model 8b --out bench_out

# Serving with SGLang's own client (sglang.benchmark.serving): none / DFLASH / DDTREE servers in
# alternating order, 3 repeats, c = 1/8/32/64, T = 0 and T = 1 / top_p 0.95; resumable (--out).
bench-serving:  ## serving with SGLang's own client: none / DFLASH / DDTREE servers (a GPU)
	$(PYTHON) benchmark/ddtree/bench_serving.py --out bench_out

# The SGLang pull request: DDTREE in-tree as a git patch against SGLang 0.5.17 (upstream/README.md),
# whole and as a series of parts that apply in order; the same for SGLang 0.5.23 (upstream/0.5.23/).
# Pristine SGLang sources: SGLANG_SRC=DIR (0.5.17's), an installed sglang of the release, or pip
# download (cached in .upstream-cache/).
upstream-patch:  ## regenerate the SGLang pull request for 0.5.17 (upstream/) and 0.5.23 (upstream/0.5.23/)
	$(PYTHON) upstream/generate.py $(if $(SGLANG_SRC),--sglang-src $(SGLANG_SRC))
	$(PYTHON) upstream/generate.py --series $(if $(SGLANG_SRC),--sglang-src $(SGLANG_SRC))
	$(PYTHON) upstream/generate.py --base 0.5.23
	$(PYTHON) upstream/generate.py --base 0.5.23 --series

# The in-tree fork: SGLang BASE's Python package (from its wheel, or an installed copy of that
# release; not SGLang's full git repository) with the series of that base applied, one commit per
# part, as a git repository in DIR (a new directory).
BASE ?= 0.5.17
fork:  ## pristine SGLang BASE's Python package (not its full git repo) + the series, a commit per part, in DIR
	@if [ -z "$(DIR)" ]; then echo "make fork: DIR=<new directory> is required, e.g. make fork BASE=$(BASE) DIR=/tmp/sglang-$(BASE)-ddtree" >&2; exit 2; fi
	$(PYTHON) upstream/fork.py --base $(BASE) --dir $(DIR) $(if $(SGLANG_SRC),--sglang-src $(SGLANG_SRC))

demo:  ## the CPU demo on the shipped trained pair
	$(PYTHON) -m sglang_ddtree.demo

# Rebuild the shipped trained pair: data on the CPU, training on one GPU (~7 min on an H200),
# then the CPU evaluation that fills metrics.json.
train-pair:  ## rebuild the shipped trained pair (one GPU, ~7 min)
	$(PYTHON) -m sglang_ddtree.pair.corpus --out .pair-data
	$(PYTHON) -m sglang_ddtree.pair.train --data .pair-data --out python/sglang_ddtree/pair/assets
	$(PYTHON) -m sglang_ddtree.pair.evaluate
