# The two commands of the README, and a few more. Everything goes through
# CMake; scripts/install-deps.sh installs what is missing first.
#
#   make run            install deps, build, run the main job (default scenario)
#   make test           install deps, then CI's three configurations, each in
#                       its own build folder, all with warnings as errors:
#                         build/         the default build (CUDA when nvcc is
#                                        found): every test but the extended ones
#                         build-nocuda/  -DAMPPROBE_CUDA=OFF (skipped when the
#                                        default build is CUDA-off already):
#                                        the labels NOCUDA_LABELS: the
#                                        Python tests on PyPI's torch 2
#                                        (scripts/torch2-venv.sh; build/'s
#                                        on Debian's torch 1.13)
#                         build-asan/    AddressSanitizer + UBSan (CUDA off):
#                                        the suite minus ASAN_EXCLUDE (below)
#                       the multi-rank tests (label mpi: mpirun, 2 and 4
#                       ranks) run in the first; they skip without mpirun
#   make test-main / test-nocuda / test-asan   one of the three
#   make test-extended  also the long tests (all 2^32 float->fp16 patterns)
#   make install PREFIX=/opt/ampprobe   library, headers, CMake package,
#                       pkg-config file and the CLI under PREFIX
#   make bench          build and run the benchmarks under bench/
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PREFIX ?= /usr/local
WERROR ?= ON
# Tests the sanitizer run leaves out: the browser tests (headless Chromium
# rendering our HTML: no ampprobe code runs under the sanitizers there), the
# PyTorch comparisons (the time goes to Python; the same C code runs in the
# other tests), the Python package's tests (an uninstrumented interpreter
# cannot load the instrumented library without LD_PRELOAD of libasan) and
# the install/consumer checks (label package: they build other programs,
# not run ours), and the multi-rank jobs under mpirun (label mpi: the
# library, trainer and analysis code they run is under the sanitizers in
# the one-process tests - test_comm's FP16 sum, tools.dist_postmortem's
# rank sets - and each of them pays mpirun's start-up several times; Open
# MPI's own leaks at exit need tests/dist/lsan.supp, which the tests set
# for `ctest -L mpi` in build-asan). Measured: docs/architecture.md, "Tests
# and CI".
ASAN_EXCLUDE ?= extended|browser|torch|python|package|mpi

# The CUDA-off build runs only what neither other stage covers: the Python
# package on torch 2 (build/ runs it on Debian's torch 1.13) and the
# install/consumer checks of a CUDA-off library. Every other test of a
# CUDA-off build runs in build-asan/, under the sanitizers; the multi-rank
# jobs (label mpi) run in build/, whose CPU path is this build's (no device
# here: MPI all the same). Until 2026-12-04 this stage ran the others a
# second time (~400 s of CPU on a Zen 1), and the mpi label until
# 2026-12-05 (~120 s wall).
NOCUDA_LABELS ?= python|package
NOCUDA_EXCLUDE ?= extended|browser|torch

CONFIG_FLAGS = -DAMPPROBE_WERROR=$(WERROR) $(CMAKE_FLAGS)
# UB aborts (halt_on_error) so a test fails on it instead of printing.
SAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1 \
          UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

.PHONY: all deps configure build run test test-main test-nocuda test-asan \
        test-extended install bench clean

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) $(CONFIG_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	rm -f ampprobe-run.h5
	$(BUILD)/tools/ampprobe run --trace -o ampprobe-run.h5

test: test-main test-nocuda test-asan

test-main: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE extended

# A CUDA-off build next to a CUDA one; the same build when there is no nvcc.
# The torch 2 venv (scripts/torch2-venv.sh: minutes the first time, mostly
# download) is made while the build compiles (and stopped if the build
# fails); its Python is then given to the build's tests/python (Debian's,
# saying so, when it could not be made).
test-nocuda: build
	@if grep -q '^AMPPROBE_BUILT_WITH_CUDA:INTERNAL=ON' $(BUILD)/CMakeCache.txt; then \
	  set -e; \
	  mkdir -p $(BUILD)-nocuda; \
	  bash scripts/torch2-venv.sh > $(BUILD)-nocuda/torch2-python 2> $(BUILD)-nocuda/torch2-venv.log & \
	  venv=$$!; \
	  trap 'kill $$venv 2>/dev/null || true' EXIT; \
	  cmake -S . -B $(BUILD)-nocuda -DAMPPROBE_CUDA=OFF -DAMPPROBE_BUILD_BENCH=OFF $(CONFIG_FLAGS); \
	  cmake --build $(BUILD)-nocuda -j $(JOBS); \
	  if wait $$venv; then trap - EXIT; \
	    py2=$$(tail -n 1 $(BUILD)-nocuda/torch2-python); \
	    cat $(BUILD)-nocuda/torch2-venv.log; \
	    echo "test-nocuda: tests/python with torch 2 ($$py2)"; \
	  else trap - EXIT; \
	    py2=/usr/bin/python3; \
	    cat $(BUILD)-nocuda/torch2-venv.log; \
	    echo "test-nocuda: NO torch 2 (scripts/torch2-venv.sh failed, above): tests/python with Debian's torch 1.13 again"; \
	  fi; \
	  cmake -S . -B $(BUILD)-nocuda "-DAMPPROBE_PYTHON=$$py2" > /dev/null; \
	  cd $(BUILD)-nocuda && ctest --output-on-failure -j $(JOBS) -L '$(NOCUDA_LABELS)' -LE '$(NOCUDA_EXCLUDE)'; \
	else \
	  echo "test-nocuda: $(BUILD) is CUDA-off already (no nvcc): tested by test-main"; \
	fi

test-asan: deps
	cmake -S . -B $(BUILD)-asan -DAMPPROBE_CUDA=OFF -DAMPPROBE_SANITIZE=ON \
	      -DAMPPROBE_BUILD_BENCH=OFF $(CONFIG_FLAGS)
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && $(SAN_ENV) ctest --output-on-failure -j $(JOBS) -LE '$(ASAN_EXCLUDE)'

test-extended: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

bench: build
	bash bench/run-all.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD)-nocuda $(BUILD)-asan
