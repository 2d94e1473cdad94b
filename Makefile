# libtorchcomm: build, install, test. Every recipe is a script in scripts/
# (each runnable by itself; its header says what it does). `make test` and
# `make run` first run `make deps`, the only target that installs or
# downloads anything; `make build` uses what is there.

PREFIX ?= /usr/local
CARGO  ?= cargo
CC     ?= cc
CXX    ?= c++
export PREFIX CARGO CC CXX DESTDIR NCCL_WHEEL_VERSION
S := scripts
# Targets after `build` skip the scripts' own incremental build.
AFTER_BUILD := TC_BUILT=1

.PHONY: all build deps lint header header-check header-compile symbols-check \
        cargo-test nccl-wheel nccl-real-test capi-test capi-valgrind sim-gpu-test \
        install uninstall install-check wheel wheel-test test run bench bench-deps bench-store \
        bench-host bench-small bench-multihost bench-p2p bench-window bench-window-ucx bench-sparse bench-reducer bench-torchcomms-call bench-local bench-torch run-reducer \
        torch-parity torch-ext torch-backend-test torch-suite ucx-hosts-test cpp-test python-test torchcomms-test torch-interop gpu-suite gpu-test gpu-bench clean

all: build

# Debian packages (apt-get when root), rustfmt/clippy, the crates (cargo fetch).
deps:
	$(S)/deps.sh

# Release library, libtorchcomm-gloo.so, tc-run, tc-perf; offline.
build:
	$(S)/build.sh

# The whole suite; CI runs it on a clean clone (.ci/run). A new check is one
# more prerequisite here.
test: deps lint build header-check header-compile symbols-check cargo-test nccl-real-test \
      capi-test sim-gpu-test capi-valgrind install-check cpp-test python-test torchcomms-test torch-parity \
      torch-interop torch-backend-test hier-hosts-test wheel-test
	@echo "make test: all checks passed"

# The main job: examples/demo.c on 4 processes under tc-run.
run: deps build
	$(AFTER_BUILD) $(S)/run-demo.sh 4

# The gradient reducer in a data-parallel training loop (examples/reducer_train.c).
run-reducer: build
	$(AFTER_BUILD) bash scripts/run-reducer.sh 4

# cargo fmt --check, clippy -D warnings, no new module import cycle.
lint:
	$(S)/lint.sh

# include/torchcomm.h from the sources; -check: it is current; -compile: C11, C++17.
header:
	$(S)/header.sh write
header-check:
	$(S)/header.sh check
header-compile:
	$(S)/header.sh compile

symbols-check: build
	$(AFTER_BUILD) $(S)/symbols-check.sh
cargo-test: build
	$(AFTER_BUILD) $(S)/cargo-test.sh
capi-test: build
	$(AFTER_BUILD) $(S)/capi-test.sh
capi-valgrind: build
	$(AFTER_BUILD) $(S)/capi-test.sh --valgrind

# The real NCCL (the nvidia-nccl-cu13 wheel) without a GPU; SKIPPED without it.
nccl-wheel:
	$(S)/nccl-real-test.sh fetch
nccl-real-test: build nccl-wheel
	$(AFTER_BUILD) $(S)/nccl-real-test.sh test

# The GPU suite on a SIMULATED CUDA driver and NCCL (tests/sim_gpu/); not a
# GPU verification.
sim-gpu-test: build
	bash tests/sim_gpu/run-sim.sh

# Parity with PyTorch (torch from PyPI in build/torch-venv, or
# TORCHCOMM_TORCH_VENV); each script prints SKIPPED with the reason when torch
# cannot be had.
torch-parity: build
	$(AFTER_BUILD) bash scripts/test-torch-parity-sparse.sh
	$(AFTER_BUILD) bash scripts/test-torch-parity-reducer.sh
	$(AFTER_BUILD) bash scripts/local-parity.sh
# torch's stores, process groups and launchers (torchrun, two hosts as
# network namespaces when root) with our library.
torch-interop: build
	$(AFTER_BUILD) bash scripts/test-torch-interop.sh

# torch.distributed's C++ "torchcomm" backend, a torch extension compiled
# against the torch venv into build/torch-ext/ (cached; SKIPPED without a
# compiler or torch headers: the Python backend is used then).
torch-ext:
	bash scripts/build-torch-ext.sh
# torch.distributed's "torchcomm" backend (C++ when built, and Python): DDP
# and FSDP2 against gloo, a killed peer, docs/python.md's DDP program, a
# subset of torch's own suite. Builds torch-ext first.
torch-backend-test: build
	$(AFTER_BUILD) bash scripts/test-torch-backend.sh
# torch's whole distributed suite on "torchcomm" and gloo, side by side
# (long: not in `make test`); BACKENDS="torchcomm" narrows it.
torch-suite: build
	$(AFTER_BUILD) bash scripts/torch-suite.sh

# Hierarchical gloo collectives across hosts made of network namespaces (root).
hier-hosts-test: build ; $(AFTER_BUILD) bash scripts/test-hier-hosts.sh
# UCX as the host transport across hosts made of network namespaces (root;
# about 4 to 5 minutes here, so not in `make test`).
ucx-hosts-test: build ; $(AFTER_BUILD) bash scripts/test-ucx-hosts.sh

# The C++ header (C++17, C++20, valgrind) and the Python package (pytest).
cpp-test: build
	$(AFTER_BUILD) bash scripts/test-cpp.sh
python-test: build
	$(AFTER_BUILD) bash scripts/test-python.sh

# torchcomm.torchcomms (torchcomms' API) and the torch store bridge under
# tc-run and torchrun, and seed 004's examples.
torchcomms-test: build
	$(AFTER_BUILD) bash scripts/test-torchcomms.sh

# PREFIX (default /usr/local), DESTDIR; install-check uses build/stage.
install: build
	$(AFTER_BUILD) $(S)/install.sh
uninstall:
	$(S)/install.sh --uninstall
install-check: build
	$(AFTER_BUILD) $(S)/install-check.sh

# The Python wheel with the libraries inside, libgloo vendored, and the torch
# extension's source (build/wheel/*.whl; needs patchelf); wheel-test installs
# it into fresh venvs: a 2-process all_reduce with the system's libgloo
# hidden, and with torch the C++ backend compiled on first use.
wheel: build
	$(AFTER_BUILD) $(S)/build-wheel.sh
wheel-test: build
	$(AFTER_BUILD) $(S)/test-wheel.sh

# Benchmarks, not part of `make test`: tables on stdout, files in bench/results/.
bench: bench-store bench-host bench-window bench-sparse bench-reducer
bench-deps:
	$(S)/deps.sh --bench
bench-store: build
	$(AFTER_BUILD) $(S)/bench-store.sh
bench-host: build bench-deps
	$(AFTER_BUILD) $(S)/bench-host.sh
# The six small collectives, 4 B to 4 KiB, 2/3/4 ranks, against Open MPI.
bench-small: build bench-deps
	$(AFTER_BUILD) $(S)/bench-small-collectives.sh
bench-multihost: build bench-deps
	$(AFTER_BUILD) $(S)/bench-multihost.sh
bench-window: build
	$(AFTER_BUILD) $(S)/bench-window.sh
bench-window-ucx: build
	$(AFTER_BUILD) $(S)/bench-window-ucx.sh
bench-sparse: build
	$(AFTER_BUILD) bash scripts/bench-sparse.sh
bench-reducer: build
	$(AFTER_BUILD) bash scripts/bench-reducer.sh
# torchcomm.torchcomms' cost per call against tc-perf (4 B all_reduce, 2 ranks).
bench-torchcomms-call: build
	$(AFTER_BUILD) bash scripts/bench-torchcomms-call.sh
# tc_local_* host cost per call on the simulated stack (make sim-gpu-test first).
bench-p2p: build
	$(AFTER_BUILD) $(S)/bench-p2p.sh
bench-local: build
	$(AFTER_BUILD) bash scripts/bench-local.sh
# torch.distributed: "torchcomm" against gloo and our C call (all_reduce, DDP).
bench-torch: build
	$(AFTER_BUILD) bash scripts/bench-torch.sh

# GPU: gpu-suite/ gathered here; gpu-test and gpu-bench run on the GPU
# machine from the repository root (no cargo there). See docs/gpu-testing.md.
gpu-suite: build
	$(AFTER_BUILD) $(S)/gpu-suite.sh
# GPU_TESTS: part1 (default), part2, part3, part4, all, list, or test names.
GPU_TESTS ?=
gpu-test:
	bash gpu-suite/run.sh $(GPU_TESTS)
gpu-bench:
	bash gpu-suite/bench/run-gpu-bench.sh gpu-suite

clean:
	$(CARGO) clean
	rm -rf build
