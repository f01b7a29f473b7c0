# The two commands of the README, and a few more. Everything goes through
# CMake in build/; scripts/install-deps.sh installs what is missing first.
#
#   make run            install, build, run the main job (default scenario)
#   make test           install, build, run every test through CTest
#   make test-extended  also the long tests (all 2^32 float->fp16 patterns)
#   make bench          build and run the benchmarks under bench/
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test test-extended bench clean

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/tools/ampprobe run --trace -o ampprobe-run.h5

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE extended

test-extended: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	bash bench/run-all.sh $(BUILD)

clean:
	rm -rf $(BUILD)
