# Two commands for a newcomer: `make demo` and `make test`. Every target sets up what it needs.
# Override the torch build for a GPU machine, e.g.  make demo TORCH=torch==2.5.1
PYTHON ?= python3
TORCH  ?= torch==2.13.0
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO_ARGS ?=
BENCH_ARGS ?=
PYTEST_ARGS ?=
# Some images set PYTHONDONTWRITEBYTECODE: then every one of the suite's Python processes
# compiles the project again, and pytest rewrites every test module's asserts again (4 s of
# the collection's 9 here). The caches go to __pycache__ (ignored by git).
unexport PYTHONDONTWRITEBYTECODE
# pytest-xdist workers: the machine's cores, at most 4 (each may start ranks and a broker).
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)

.PHONY: setup tools demo test test-fast test-gpu stress fuzz bench clean help

help:
	@echo "make demo   - embedded Kafka broker + synthetic click stream + training, ends with a report"
	@echo "make test   - run the test suite (starts its own broker)"
	@echo "make test-fast - the unit tests and the in-process multi-rank ones (no broker, no spawned ranks; under a minute)"
	@echo "make stress - the thread ranks' exactness tests, STRESS_RUNS times, on a machine kept busy (--hog)"
	@echo "make bench  - run the benchmarks (figures and ratios against in-run baselines)"
	@echo "make test-gpu TORCH=<CUDA build> - on a GPU machine: the CUDA tests, GPU against CPU speed"
	@echo "make fuzz   - the decoders' fuzz at length (hypothesis profile long; make test runs it briefly)"
	@echo "make clean  - remove the virtual environment and build outputs"
	@echo "Variables: TORCH=$(TORCH) PYTHON=$(PYTHON) DEMO_ARGS=... BENCH_ARGS=... PYTEST_ARGS=..."

setup: $(STAMP)

# The stamp records the torch requirement: a different TORCH=... forces a reinstall.
ifneq ($(shell cat $(STAMP) 2>/dev/null),$(TORCH))
.PHONY: $(STAMP)
endif

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[embedded,test,librdkafka]"
	@echo "$(TORCH)" > $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hetgmp demo $(DEMO_ARGS)

# Debian tools the tests use: a real Prometheus server and promtool (package prometheus),
# docker-compose to validate the compose file offline, and headless chromium to look at the demo
# report as a browser shows it. Installed with apt-get as root (CI) or through passwordless
# sudo; otherwise the note says what to install.
APT_PACKAGES := prometheus docker-compose chromium
tools:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v docker-compose >/dev/null && command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian packages: $(APT_PACKAGES)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null && command -v apt-get >/dev/null; then \
		echo "installing Debian packages with sudo: $(APT_PACKAGES)"; \
		sudo -n apt-get update -qq && sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	else echo "note: install Debian's $(APT_PACKAGES) (apt-get install $(APT_PACKAGES)): the metrics tests need a real Prometheus, the report tests chromium"; fi

# The tests marked serial race the clock: they run alone once the others are done (exit code 5,
# none selected, is fine when PYTEST_ARGS picks a part of the suite).
test: $(STAMP) tools
	$(PY) -m pytest -n $(JOBS) --dist loadfile -m "not serial" $(PYTEST_ARGS)
	$(PY) -m pytest -m serial $(PYTEST_ARGS); rc=$$?; [ $$rc = 0 ] || [ $$rc = 5 ]

# No broker, no spawned ranks, nothing slow: the multi-rank protocols run on ranks that are
# threads of the test process (trainer.dist.ThreadComm). The Debian tools too: promtool checks
# the Prometheus configuration among the fast tests.
test-fast: $(STAMP) tools
	$(PY) -m pytest -q -n $(JOBS) --dist loadfile -m "not broker and not distributed and not slow" $(PYTEST_ARGS)

# The multi-rank exactness tests whose ranks are threads, run STRESS_RUNS times with two busy
# processes beside them and threads switched every 10 us (tests/conftest.py --hog): a result
# that depends on timing (a race, a decision read off the wall clock) shows up as a failure.
STRESS_RUNS ?= 5
STRESS_TESTS := tests/trainer/test_exchange.py tests/trainer/dist/test_threads.py \
	tests/trainer/dist/test_lists_exact.py tests/trainer/test_step.py \
	tests/trainer/dist/test_tier_exact.py
stress: $(STAMP)
	@for i in $$(seq $(STRESS_RUNS)); do echo "stress run $$i of $(STRESS_RUNS)"; \
		$(PY) -m pytest -q --hog 2 $(STRESS_TESTS) $(PYTEST_ARGS) || exit 1; done

# The tests marked cuda (skipped by `make test` where there is no GPU), then one rank's training
# speed on the GPU against the CPU: bench/gpu_check.sh.
test-gpu: $(STAMP)
	PYTHON=$(PY) bash bench/gpu_check.sh

# The decoders' property (every record decoded to finite values or rejected by reason, never a
# raise) over many more drawn records than make test's few seconds: a few minutes.
fuzz: $(STAMP)
	HETGMP_FUZZ_PROFILE=long $(PY) -m pytest -q -p no:randomly tests/streaming/test_fuzz_decoders.py --hypothesis-show-statistics $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/hetgmp bench all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info reports .pytest_cache
