# make test / make demo work on a fresh machine: each creates .venv if missing, installs the
# package with the pinned versions in constraints.txt, installs Debian's chromium if missing, then runs.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WORKDIR ?= workdir/demo
PYTEST_ARGS ?=
# pytest-xdist workers for make test / test-fast; whole test files go to one worker (--dist loadfile) so that
# each module's fixtures are built once, the costliest files first (--no-loadscope-reorder keeps the order
# tests/conftest.py gives). 2 = the CI machine's cores; PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: test test-fast demo base install chromium bench bench-quick clean

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

# libtpu's compiler for the ahead-of-time TPU compiles (tests marked tpu_aot, `plan --compile`): the version that
# matches constraints.txt's jax, in its own folder off the venv's import path (rmsweb_jax/plan/tpu_aot.py says why).
LIBTPU_VERSION := 0.0.42

# setup.py's extra 'browsergym' (our policies inside BrowserGym), so that make test runs its tests: --no-deps, because
# browsergym-core 0.14.3 pins playwright==1.44 against our 1.65.2 (BUILD.md §6; the adapter runs on ours).
BROWSERGYM := browsergym-core browsergym-miniwob beautifulsoup4 soupsieve pyparsing

# torch is the test-time reference only; install the CPU build (on local disk) first so that
# nothing later can pull a CUDA build.
# --no-compile: Python byte-compiles a module when it is first imported; compiling every file at install time
# (torch, jax, ...) spends CPU on files no test imports (in the launcher's venv, 60% of the install's CPU).
$(STAMP): $(VPY) setup.py constraints.txt Makefile
	$(VPY) -m pip install -q --no-compile "torch==2.13.0"
	$(VPY) -m pip install -q --no-compile -c constraints.txt -e ".[test]"
	$(VPY) -m pip install -q --no-compile --no-deps -c constraints.txt $(BROWSERGYM)
	rm -rf $(VENV)/libtpu
	$(VPY) -m pip install -q --no-compile --no-deps --target $(VENV)/libtpu "libtpu==$(LIBTPU_VERSION)"
	touch $(STAMP)

install: $(STAMP)

chromium:
	@if [ -x /usr/bin/chromium ] || [ -x /usr/lib/chromium/chromium ]; then :; else \
	  echo "installing Debian's chromium (apt-get)"; \
	  (apt-get update -qq || sudo apt-get update -qq) && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium || \
	   sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium); fi

# lint-imports: the layer contract in .importlinter (a lower layer never imports a higher one).
# The TPU ahead-of-time compiles (tests marked tpu_aot) run beside the rest at the lowest CPU priority (nice 19):
# they take the cores only while the other tests wait on browsers, servers and subprocesses, so the two-process
# gloo tests keep their rendezvous deadline (at equal priority the compiles starved them), and the suite does not
# wait for the compiles after the rest. Their output goes to $(AOT_LOG) and is printed when both have finished.
AOT_LOG ?= .pytest-tpu_aot.log
test: install chromium
	$(VENV)/bin/lint-imports
	@echo "TPU ahead-of-time compiles (pytest -m tpu_aot) run in the background at nice 19; their log: $(AOT_LOG)"
	@nice -n 19 $(VPY) -m pytest $(XDIST) -m tpu_aot $(PYTEST_ARGS) > $(AOT_LOG) 2>&1 & aot=$$!; \
	  trap 'kill $$aot 2>/dev/null' INT TERM; \
	  $(VPY) -m pytest $(XDIST) -m "not tpu_aot" $(PYTEST_ARGS); rest=$$?; \
	  echo "waiting for the TPU ahead-of-time compiles (tail -f $(AOT_LOG))"; \
	  wait $$aot; aot_rc=$$?; echo "== pytest -m tpu_aot ($(AOT_LOG))"; cat $(AOT_LOG); \
	  for rc in $$rest $$aot_rc; do case $$rc in 0|5) ;; *) exit 1;; esac; done  # 5: PYTEST_ARGS selected none

test-fast: install chromium
	$(VENV)/bin/lint-imports
	$(VPY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

demo: install chromium
	$(VPY) -m rmsweb_jax.main --config=configs/demo.py --workdir=$(WORKDIR)

# The base policy's grounding pretraining on synthetic pages (configs/base.py; hours on 2 cores, resumable: rerun
# to go on). BASE_CONFIG=configs/base.py:pilot is its first look (tens of minutes).
BASE_CONFIG ?= configs/base.py
BASE_WORKDIR ?= workdir/base
base: install
	$(VPY) -m rmsweb_jax.main --config=$(BASE_CONFIG) --workdir=$(BASE_WORKDIR)

bench-quick: install
	cd bench && for s in *.py; do case $$s in common.py|gpu_*|env_*) continue;; esac; \
	  echo "== $$s"; ../$(VPY) $$s --quick || exit 1; done

clean:
	rm -rf $(VENV) workdir .pytest_cache $(AOT_LOG)

# The live benchmarks' task files at pinned commits, sha256-checked, into $(BENCHMARKS_DEST)
# (default: $$RMSWEB_DATA or ~/.cache/rmsweb_jax/benchmarks, where the collect stage looks).
.PHONY: benchmarks
benchmarks: install
	$(VPY) -m rmsweb_jax.suites.download --suite=all $(if $(BENCHMARKS_DEST),--dest=$(BENCHMARKS_DEST))
