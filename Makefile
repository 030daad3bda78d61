# The two Quick start commands (README.md): `make demo` and `make test`. Both install what
# is missing (scripts/install-deps) and build with CMake into build/ (`make test` also into
# build/starpu-cuda and build/fake-gpu: scripts/test-fake-gpu).
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps build demo test test-cuda test-fxt clean

all: build

deps:
	@scripts/install-deps

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@scripts/demo $(BUILD)

# Then the CUDA path through StarPU on the fake device (tests/gpu/fake): StarPU with CUDA
# built once into $(BUILD)/starpu-cuda, starpipe on the fake device in $(BUILD)/fake-gpu,
# ctest -L gpu-fake there (skipped with a notice without the CUDA toolkit).
test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@JOBS=$(JOBS) scripts/test-fake-gpu $(BUILD)

# The CUDA build (no GPU needed to build): StarPU with CUDA into build/starpu-cuda, then
# starpipe with CUDA and NCCL into build-cuda, and its CPU tests with CUDA workers off.
STARPU_CUDA ?= $(BUILD)/starpu-cuda
CUDA_BUILD ?= build-cuda
test-cuda: deps
	@scripts/build-starpu-cuda $(STARPU_CUDA)
	@cmake -S . -B $(CUDA_BUILD) -DCMAKE_BUILD_TYPE=Release -DSTARPIPE_STARPU_PREFIX=$(abspath $(STARPU_CUDA)) >/dev/null
	@cmake --build $(CUDA_BUILD) -j $(JOBS)
	@cd $(CUDA_BUILD) && STARPU_NCUDA=0 ctest --output-on-failure -j $(JOBS)

# StarPU's FxT trace against the plan's messages (scripts/test-fxt; CI runs it): a StarPU
# with FxT into $(BUILD)/starpu-fxt, starpipe-gpt into $(BUILD)/fxt.
test-fxt: deps
	@JOBS=$(JOBS) scripts/test-fxt $(BUILD)

clean:
	rm -rf $(BUILD)
