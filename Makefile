# Entry points of a fresh machine: `make demo` (the main job) and `make test`.
# Each installs the Debian packages it needs, configures and builds; the tests also install
# their PyPI references (Hugging Face's libraries, the openai client) into .venv.
BUILD ?= build
JOBS ?= 2

.PHONY: deps test-deps bench-peers configure build demo test test-unit test-oracle test-gpu gpu-pack llmc bench clean

deps:
	./scripts/install-deps.sh

# The tests' references from PyPI, pinned in tests/python/*.txt, into the project's .venv.
test-deps: deps
	./scripts/install-python-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target meshtrain
	./$(BUILD)/apps/meshtrain/meshtrain pretrain --output-dir runs/demo --overwrite --sample-every 400

test: build test-deps
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-unit: build test-deps
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L unit

test-oracle: build test-deps
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L oracle

# The GPU tests alone (label gpu; they skip, saying so, where no GPU is visible).
test-gpu: build test-deps
	cd $(BUILD) && ctest --output-on-failure -L gpu

# The archive the GPU machine runs (scripts/gpu_pack.sh): binaries, their libraries, test data.
gpu-pack: build
	BUILD=$(BUILD) ./scripts/gpu_pack.sh

# llm.c's GPT-2 trainer, built from a checkout of its public repository beside the project for
# the GPU side-by-side (gpu_run.sh llmc); gpu-pack packs it once built:
#   make llmc LLMC_SRC=path/to/llm.c CUDNN_FRONTEND=path/to/cudnn-frontend/include
llmc:
	./bench/llmc_build.sh $(LLMC_SRC) $(CUDNN_FRONTEND) .gpu/llmc

# bench/'s peers, not needed by make test: a current PyTorch (eager, torch.compile) and the
# seed systems (Redco, JAX, Flax, Optax) in .venv-bench, pinned in bench/requirements-peers.txt.
bench-peers: deps
	./scripts/install-bench-peers.sh

bench: build
	./$(BUILD)/bench/matmul_bench

clean:
	rm -rf $(BUILD)
