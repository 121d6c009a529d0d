# One obvious way to run everything. `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
# A local copy of the Multi30k release; without it, prepare_data.py downloads the official files.
MULTI30K_SOURCE ?= $(wildcard ../shared/data/multi30k)
# Where `make demo` trains: git-ignored (docs/results/de_en_small_quickstart_8min is the committed record of one such run).
RUN_DIR ?= runs/quickstart
# The recipe `make demo` trains: empty to choose from measurements (scripts/quickstart.py), or
# quickstart (bf16) / quickstart_fp32 to force one, e.g. `make demo RECIPE=quickstart_fp32`.
RECIPE ?=

.PHONY: help install browser data demo test test-unit test-fast lint format bench bench-engines bench-train bench-decode \
	ablation-gpu ablation-cpu ablation-length ablation-length-ft ablation-uptrain ablation-rnn \
	gpu-bundle gpu-check clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'

install: $(VENV)/.installed  ## create the venv: torch 2.13.0 first (it prints which build: CPU or CUDA), then the project

# torch==2.13.0 comes from pip's configured index: a plain Linux x86-64 machine gets PyPI's CUDA build
# (it runs on CPUs too); a pip configured with the +cpu wheel (an index or find-links) gets the CPU build.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	@$(PY) -c "import torch; print('installed torch', torch.__version__, '-', \
		f'CUDA build (CUDA {torch.version.cuda})' if torch.version.cuda else 'CPU build (no CUDA)')"
	touch $@

data: install  ## prepare Multi30k under data/multi30k (copy from MULTI30K_SOURCE or download)
	$(PY) scripts/prepare_data.py $(if $(MULTI30K_SOURCE),--source $(MULTI30K_SOURCE))

demo: data  ## the main job: measure, train quickstart or quickstart_fp32 (<= 10 min on 2 CPU cores), translate
	$(PY) scripts/quickstart.py$(if $(RECIPE), --recipe $(RECIPE)) hydra.run.dir=$(RUN_DIR)
	$(PY) translate.py $(RUN_DIR)/checkpoints/best.ckpt "Ein Mann fährt mit dem Fahrrad." "Zwei Hunde spielen im Schnee."

# The page's browser test (tests/integration/test_page.py) drives the distribution's Chromium: installed
# here where apt-get can (as root), quietly; where it cannot, that test is skipped and says why.
browser:  ## install Debian's chromium for the browser test, where apt-get can (root); never fails
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; }; } && \
	  echo "installed chromium for the browser test"; } || \
	echo "no chromium (not root, or no apt-get): the browser test will be skipped"

# Test files run in parallel, one worker per core (at most 4), a file's tests on one worker (they share its
# module fixtures); each worker gets its share of the cores' threads (tests/conftest.py). TEST_WORKERS=0: serial.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))

test: install browser  ## every test of every layer (unit, integration, scripts), slow-marked ones included (CI)
	$(PY) -m pytest -q -m "slow or not slow" -n $(TEST_WORKERS) --dist loadfile --durations=20 tests

test-unit: install  ## the unit layer only (tests/unit), slow-marked tests included
	$(PY) -m pytest -q -m "slow or not slow" tests/unit

test-fast: install  ## the quick development loop: slow-marked tests deselected
	$(PY) -m pytest -q

lint: install  ## ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install  ## apply ruff fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: install  ## attention benchmark: time and memory vs length for every kernel (CSV + PNG in docs/bench)
	$(PY) scripts/bench_attention.py --device cpu

CKPT ?= $(RUN_DIR)/checkpoints/best.ckpt
bench-decode: install  ## decoding sentences/s of CKPT (greedy and beam 5) on its test set
	$(PY) scripts/bench_decode.py $(CKPT) --beams 1 5

bench-engines: install  ## decoding speed and BLEU of CKPT: torch fp32/bf16 against CTranslate2 fp32/int8
	$(PY) scripts/bench_engines.py $(CKPT)

bench-train: install  ## training tokens/s and peak memory of the quickstart config (BENCH_ARGS: more overrides)
	$(PY) scripts/bench_train.py experiment=quickstart $(BENCH_ARGS)

# The GPU check (issue 48) for whoever is lent a GPU for a few minutes: `make gpu-bundle` here fetches the
# wheels the GPU machine's image lacks into .whl/ (git-ignored) and prints the device tool's call, which
# carries .whl and data/multi30k and runs `bash scripts/gpu_check.sh $OUT` there (docs/throughput.md).
gpu-bundle: data  ## fetch the wheels the GPU check needs on a lent GPU into .whl/; sizes and the run call
	$(PY) scripts/gpu_bundle.py

GPU_CHECK_OUT ?= runs/gpu-check
gpu-check:  ## on a GPU: its tests, issue 48's benchmark rows, a short training; one report in GPU_CHECK_OUT (<6 min)
	bash scripts/gpu_check.sh $(GPU_CHECK_OUT)

# Where an ablation sweep writes (fixed once per make call, so both multiruns of ablation-gpu share it).
SWEEP := $(or $(SWEEP),multirun/ablation/$(shell date +%Y-%m-%d_%H-%M-%S))
# Sweep (a) is two multiruns into one SWEEP, the report written by the second: a failed job of the first
# (train.py -m exits non-zero) still lets the second run and report, and then fails the target.
ablation-gpu: data  ## sweep (a): 6 Transformer attention variants x 3 seeds on one GPU, one report in SWEEP
	$(PY) train.py -m experiment=ablation_gpu attention=eager heads=mha,gqa,mqa seed=1,2,3 \
		hydra.sweep.dir=$(SWEEP) '~hydra.callbacks.ablation_report'; first=$$?; \
	$(PY) train.py -m experiment=ablation_gpu attention=flash,sparse,linear seed=1,2,3 hydra.sweep.dir=$(SWEEP) \
		&& exit $$first

ablation-cpu: data  ## sweep (a) on a CPU: the same 6 variants x 3 seeds, 4 min each, one at a time
	$(PY) train.py -m experiment=ablation_cpu attention=eager heads=mha,gqa,mqa seed=1,2,3 \
		hydra.sweep.dir=$(SWEEP) '~hydra.callbacks.ablation_report'; first=$$?; \
	$(PY) train.py -m experiment=ablation_cpu attention=flash,sparse,linear seed=1,2,3 hydra.sweep.dir=$(SWEEP) \
		&& exit $$first

ablation-length: data  ## sweep (c): 7 attention choices x input lengths (data.concat) x 3 seeds, 10 min each, resumable
	$(PY) train.py -m experiment=ablation_length attention=eager,sdpa,sparse,linear,linformer,lsh,long_mix \
		data.concat=1,4,16,64 seed=1,2,3 hydra.sweep.dir=$(SWEEP) resume=true

# The fine-tune arm's lengths (K=1 would only train the start model 10 more minutes at its own length).
FT_CONCAT ?= 4,16,64
ifneq ($(filter ablation-length-ft,$(MAKECMDGOALS)),)
ifndef FROM
$(error make ablation-length-ft needs FROM=<the sweep dir of make ablation-length>, e.g. FROM=multirun/ablation/<date_time>)
endif
endif
ablation-length-ft: data  ## its fine-tune arm, needs FROM=<ablation-length's sweep dir>: each job starts from its K=1 job
	$(PY) train.py -m experiment=ablation_length_finetune from_sweep=$(FROM) \
		attention=eager,sdpa,sparse,linear,linformer,lsh,long_mix data.concat=$(FT_CONCAT) seed=1,2,3 \
		hydra.sweep.dir=$(SWEEP) resume=true

# The uptraining ablation (issue 50): FROM, a trained eager MHA checkpoint of the quickstart model; its
# training steps BASE_STEPS; UPTRAIN_STEPS, the converted arm's steps (Ainslie et al. 2023: ~5% of the base's).
UPTRAIN_VARIANTS ?= linear,linformer,sparse
ifneq ($(filter ablation-uptrain,$(MAKECMDGOALS)),)
ifeq ($(and $(FROM),$(BASE_STEPS),$(UPTRAIN_STEPS)),)
$(error make ablation-uptrain needs FROM=<a trained eager MHA checkpoint> BASE_STEPS=<its training steps> UPTRAIN_STEPS=<the converted arm's steps>)
endif
endif
UPTRAIN_ARGS = experiment=ablation_uptrain uptrain.base=$(FROM) uptrain.steps=$(UPTRAIN_STEPS) \
	uptrain.total_steps=$$(( $(BASE_STEPS) + $(UPTRAIN_STEPS) )) arm=converted,scratch seed=1,2,3 \
	hydra.sweep.dir=$(SWEEP) resume=true
ablation-uptrain: data  ## converted+uptrained vs scratch per attention variant, needs FROM, BASE_STEPS, UPTRAIN_STEPS; resumable
	$(PY) train.py -m $(UPTRAIN_ARGS) attention=eager heads=mha,gqa,mqa '~hydra.callbacks.ablation_report'; \
	first=$$?; $(PY) train.py -m $(UPTRAIN_ARGS) attention=$(UPTRAIN_VARIANTS) && exit $$first

ablation-rnn: data  ## sweep (b): the 4 RNN attention mechanisms x 3 seeds, 3 min each, report in SWEEP
	$(PY) train.py -m experiment=ablation_rnn attention=additive,luong_dot,luong_general,luong_concat \
		seed=1,2,3 hydra.sweep.dir=$(SWEEP)

clean:  ## remove caches and run outputs (keeps data/ and the venv)
	rm -rf outputs multirun .pytest_cache .ruff_cache
