# The README's two commands. Both set everything up on a fresh machine: a virtual
# environment in .venv, envrl installed into it (editable, with test extras), then the job.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.envrl-installed
RUNS_DIR ?= runs/demo
WORKERS ?= 2
EVAL = $(BIN)/envrl eval --workers $(WORKERS) --runs-dir $(RUNS_DIR)
# the training part of the demo: TextWorld's short custom quests, a from-scratch model, SFT on the expert
TRAIN_DIR ?= runs/demo-train
TW_CUSTOM = --env textworld --max-steps 15 --env-arg 'families=["custom"]' --episodes 34
CPU_CONFIG = benchmarks/configs/textworld_cpu.yaml
# the diagnostic tasks (docs/diagnostics.md), at their default difficulty
DIAGNOSTICS = diag-chain diag-dynamics diag-alternatives diag-generalization

# Tests: fast ones by default; CI (CI=true) runs all of them: slow, browser and container too.
ifeq ($(CI),true)
MARKERS ?= slow or not slow
else
MARKERS ?= not slow and not browser and not container
endif

.PHONY: demo test lint install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,webshop,browser,scienceworld,ray,train,llm,web,trl,openenv,verifiers]'
	touch $(STAMP)

# Random and expert agents on the ID and OOD splits of ALFWorld, WebShop, TextWorld, ScienceWorld and
# the four diagnostics (200 episodes each, about a second a run), then a short training run, then the leaderboard. (TextWorld and ScienceWorld: 30 episodes per split;
# ScienceWorld's 30 cover all 30 tasks; TextWorld's games are generated on first use, ~1 min per split.)
# Training (a few minutes on 2 cores): a from-scratch model learns TextWorld's custom quests by SFT on
# 60 expert episodes; it is evaluated before and after (agents sft-demo@0 and sft-demo@50) beside
# random and expert on the same 34 ID and 34 OOD custom games (their own run ids: the first TextWorld
# runs above use the default families, and a run id names one setup).
demo: $(STAMP)
	env -u ALFWORLD_DATA $(EVAL) --env alfworld --split valid_seen --agent expert --episodes 140
	env -u ALFWORLD_DATA $(EVAL) --env alfworld --split valid_unseen --agent expert --episodes 134
	env -u ALFWORLD_DATA $(EVAL) --env alfworld --split valid_seen --agent random --episodes 140
	env -u ALFWORLD_DATA $(EVAL) --env alfworld --split valid_unseen --agent random --episodes 134
	$(EVAL) --env webshop --split test --agent expert --episodes 500
	$(EVAL) --env webshop --split test_ood --agent expert --episodes 264
	$(EVAL) --env webshop --split test --agent random --episodes 500
	$(EVAL) --env webshop --split test_ood --agent random --episodes 264
	$(EVAL) --env textworld --split valid --agent expert --episodes 30
	$(EVAL) --env textworld --split test_ood --agent expert --episodes 30
	$(EVAL) --env textworld --split valid --agent random --episodes 30
	$(EVAL) --env textworld --split test_ood --agent random --episodes 30
	$(EVAL) --env scienceworld --split dev --agent expert --episodes 30
	$(EVAL) --env scienceworld --split test --agent expert --episodes 30
	$(EVAL) --env scienceworld --split dev --agent random --episodes 30
	$(EVAL) --env scienceworld --split test --agent random --episodes 30
	for env in $(DIAGNOSTICS); do for split in valid test_ood; do for agent in expert random; do \
		$(EVAL) --env $$env --split $$split --agent $$agent --episodes 200 || exit 1; done; done; done
	$(EVAL) $(TW_CUSTOM) --split valid --agent random --run-id textworld-custom-valid-random-s0
	$(EVAL) $(TW_CUSTOM) --split test_ood --agent random --run-id textworld-custom-test_ood-random-s0
	$(EVAL) $(TW_CUSTOM) --split valid --agent expert --run-id textworld-custom-valid-expert-s0
	$(EVAL) $(TW_CUSTOM) --split test_ood --agent expert --run-id textworld-custom-test_ood-expert-s0
	test -f $(TRAIN_DIR)/model/config.json || $(BIN)/envrl model init $(TRAIN_DIR)/model --size tiny --envs textworld --vocab-size 2048
	test -f $(TRAIN_DIR)/expert/meta.json || $(BIN)/envrl data expert --env textworld --split train --episodes 60 \
		--template compact --history 0 --env-arg 'families=["custom"]' --out $(TRAIN_DIR)/expert --no-progress
	$(BIN)/envrl train --algo sft --env textworld --model $(TRAIN_DIR)/model --data $(TRAIN_DIR)/expert \
		--out $(TRAIN_DIR)/sft --config $(CPU_CONFIG) --updates 50 --set name=sft-demo --set optim.lr=3e-3 --set algorithm.objective=choice \
		--runs-dir $(RUNS_DIR) --no-progress
	$(BIN)/envrl leaderboard --runs-dir $(RUNS_DIR)

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "$(MARKERS)"

# Lint and format (ruff) and types (mypy), configured in pyproject.toml; .ci/run runs it first.
lint: $(STAMP)
	$(BIN)/ruff check envrl tests benchmarks
	$(BIN)/ruff format --check envrl tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache
