# libtorchcomm: build, install, test. `make test` and `make run` install what
# they need first (system packages through `make deps`).

PREFIX   ?= /usr/local
CARGO    ?= cargo
CC       ?= cc
CXX      ?= c++
VERSION  := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
MAJOR    := $(word 1,$(subst ., ,$(VERSION)))
REL      := target/release
LIB      := $(REL)/libtorchcomm.so
BUILD    := build
CTEST_CFLAGS := -std=c11 -Wall -Wextra -Werror -pedantic -g -Iinclude
CTEST_LIBS   := -L$(REL) -ltorchcomm -Wl,-rpath,$(abspath $(REL))
CAPI_SRCS := $(wildcard capi_tests/test_*.c)
CAPI_BINS := $(patsubst capi_tests/%.c,$(BUILD)/capi/%,$(CAPI_SRCS))
DEB_PACKAGES := libgloo-dev pkg-config cmake valgrind g++ python3 ca-certificates

.PHONY: all build deps header header-check header-compile symbols-check \
        cargo-test capi-test capi-valgrind install uninstall install-check \
        test run bench bench-store bench-deps bench-host bench-window clean

all: build

build: deps
	$(CARGO) build --release --lib --bins --examples
	@ln -sf libtorchcomm.so $(REL)/libtorchcomm.so.$(MAJOR)

# Installs missing Debian packages when run as root; otherwise prints them.
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "make deps: installing$$missing"; \
	    (export DEBIAN_FRONTEND=noninteractive; apt-get install -y --no-install-recommends $$missing || \
	     (apt-get update && apt-get install -y --no-install-recommends $$missing)) >$(BUILD_LOG) 2>&1 \
	      || { cat $(BUILD_LOG); exit 1; }; \
	  else \
	    echo "make deps: not root, so not installing:$$missing (run: sudo apt-get install$$missing); building without them"; \
	  fi; \
	fi
BUILD_LOG := /tmp/torchcomm-deps.log

header:
	$(CARGO) run --quiet --example gen_header -- include/torchcomm.h

header-check:
	@mkdir -p $(BUILD)
	$(CARGO) run --quiet --example gen_header -- $(BUILD)/torchcomm.h
	@diff -u include/torchcomm.h $(BUILD)/torchcomm.h || \
	  { echo "include/torchcomm.h is stale: run 'make header' and commit it"; exit 1; }
	@echo "header-check: include/torchcomm.h matches the sources"

# The header compiles standalone, twice in one unit, as C11 and C++17.
header-compile:
	@mkdir -p $(BUILD)
	printf '#include <torchcomm.h>\n#include <torchcomm.h>\nint main(void){return TC_SUCCESS;}\n' > $(BUILD)/header_twice.c
	$(CC) -std=c11 -Wall -Wextra -Werror -pedantic -Iinclude -c $(BUILD)/header_twice.c -o $(BUILD)/header_twice_c.o
	$(CXX) -std=c++17 -Wall -Wextra -Werror -pedantic -Iinclude -x c++ -c $(BUILD)/header_twice.c -o $(BUILD)/header_twice_cxx.o
	@echo "header-compile: C11 and C++17 OK"

symbols-check: build
	@bad=$$(nm -D --defined-only $(LIB) | awk '{print $$3}' | grep -v '^tc_' || true); \
	if [ -n "$$bad" ]; then echo "symbols-check: non-tc_ exports:"; echo "$$bad"; exit 1; fi
	@readelf -d $(LIB) | grep -q "SONAME.*libtorchcomm.so.$(MAJOR)\]" || { echo "symbols-check: bad soname"; exit 1; }
	@echo "symbols-check: $$(nm -D --defined-only $(LIB) | wc -l) symbols, all tc_*, soname libtorchcomm.so.$(MAJOR)"

cargo-test: build
	$(CARGO) test --release

$(BUILD)/capi/%: capi_tests/%.c include/torchcomm.h capi_tests/capi_util.h
	@mkdir -p $(BUILD)/capi
	$(CC) $(CTEST_CFLAGS) $< -o $@ $(CTEST_LIBS) -lpthread

capi-test: build $(CAPI_BINS)
	@set -e; for t in $(CAPI_BINS); do echo "== $$t"; TC_TEST_BIN_DIR=$(abspath $(REL)) $$t; done
	@# Bad environment values: a warning naming each variable, then defaults.
	@out=$$(TORCHCOMM_TIMEOUT_SECONDS=soon TORCHCOMM_ABORT_ON_ERROR=maybe TORCHCOMM_DEBUG=LOUD \
	  $(BUILD)/capi/test_errors 2>&1) || { echo "$$out"; exit 1; }; \
	for v in TORCHCOMM_TIMEOUT_SECONDS TORCHCOMM_ABORT_ON_ERROR TORCHCOMM_DEBUG; do \
	  echo "$$out" | grep -q "WARN $$v=" || { echo "capi-test: no warning for a bad $$v"; echo "$$out"; exit 1; }; done
	@echo "capi-test: bad environment values warn and fall back to defaults"
	@# Every exported function has its argument checks exercised.
	@missing=$$(for f in $$(nm -D --defined-only $(LIB) | awk '{print $$3}'); do \
	  grep -q "\b$$f(" capi_tests/test_every_function.c || echo $$f; done); \
	if [ -n "$$missing" ]; then echo "capi-test: not covered by test_every_function.c:" $$missing; exit 1; fi
	@echo "capi-test: every exported function is covered by test_every_function.c"
	@# The ctypes example: its constants match the header, and it runs on 3 ranks.
	@for kv in $$(sed -n 's/^\(TC_[A-Z0-9_]*\) = \(-\{0,1\}[0-9]*\)$$/\1=\2/p' examples/python/ring.py); do \
	  grep -q "^#define $${kv%%=*} $${kv#*=}$$" include/torchcomm.h || { echo "capi-test: examples/python/ring.py has $$kv, the header differs"; exit 1; }; done
	$(REL)/tc-run -n 3 -- python3 examples/python/ring.py $(abspath $(LIB))

# Every C test once more under valgrind: no errors and no definite or
# indirect leaks.
capi-valgrind: build $(CAPI_BINS)
	@set -e; for t in $(CAPI_BINS); do echo "== valgrind $$t"; \
	  TC_TEST_BIN_DIR=$(abspath $(REL)) TC_UNDER_VALGRIND=1 valgrind -q --error-exitcode=99 --leak-check=full \
	    --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect $$t >/dev/null; done
	@echo "capi-valgrind: no errors, no leaks"

install: build
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin \
	  $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/lib/cmake/torchcomm
	install -m 755 $(LIB) $(DESTDIR)$(PREFIX)/lib/libtorchcomm.so.$(VERSION)
	ln -sf libtorchcomm.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libtorchcomm.so.$(MAJOR)
	ln -sf libtorchcomm.so.$(MAJOR) $(DESTDIR)$(PREFIX)/lib/libtorchcomm.so
	if [ -f $(REL)/libtorchcomm-gloo.so ]; then install -m 755 $(REL)/libtorchcomm-gloo.so $(DESTDIR)$(PREFIX)/lib/; fi
	for b in tc-run tc-perf; do if [ -f $(REL)/$$b ]; then install -m 755 $(REL)/$$b $(DESTDIR)$(PREFIX)/bin/; fi; done
	install -m 644 include/torchcomm.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' pkgconfig/torchcomm.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/torchcomm.pc
	sed -e 's|@VERSION@|$(VERSION)|g' cmake/torchcommConfig.cmake.in > $(DESTDIR)$(PREFIX)/lib/cmake/torchcomm/torchcommConfig.cmake
	sed -e 's|@VERSION@|$(VERSION)|g' cmake/torchcommConfigVersion.cmake.in > $(DESTDIR)$(PREFIX)/lib/cmake/torchcomm/torchcommConfigVersion.cmake

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/lib/libtorchcomm.so $(DESTDIR)$(PREFIX)/lib/libtorchcomm.so.$(MAJOR) \
	  $(DESTDIR)$(PREFIX)/lib/libtorchcomm.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libtorchcomm-gloo.so \
	  $(DESTDIR)$(PREFIX)/bin/tc-run $(DESTDIR)$(PREFIX)/bin/tc-perf \
	  $(DESTDIR)$(PREFIX)/include/torchcomm.h $(DESTDIR)$(PREFIX)/lib/pkgconfig/torchcomm.pc
	rm -rf $(DESTDIR)$(PREFIX)/lib/cmake/torchcomm

# Installs into a scratch prefix and builds a user program against it twice:
# with pkg-config and with CMake's find_package(torchcomm).
install-check: build
	@rm -rf $(BUILD)/stage && $(MAKE) --no-print-directory install PREFIX=$(abspath $(BUILD)/stage) >/dev/null
	@ls -l $(BUILD)/stage/lib | grep -q 'libtorchcomm.so -> libtorchcomm.so.$(MAJOR)$$'
	@ls -l $(BUILD)/stage/lib | grep -q 'libtorchcomm.so.$(MAJOR) -> libtorchcomm.so.$(VERSION)$$'
	@test "$$(PKG_CONFIG_PATH=$(BUILD)/stage/lib/pkgconfig pkg-config --modversion torchcomm)" = "$(VERSION)" \
	  || { echo "install-check: torchcomm.pc version differs from Cargo.toml ($(VERSION))"; exit 1; }
	$(CC) -std=c11 -Wall -Wextra -Werror examples/version.c -o $(BUILD)/version_pc \
	  $$(PKG_CONFIG_PATH=$(BUILD)/stage/lib/pkgconfig pkg-config --cflags --libs torchcomm)
	LD_LIBRARY_PATH=$(BUILD)/stage/lib $(BUILD)/version_pc $(VERSION)
	@rm -rf $(BUILD)/cmake-user && mkdir -p $(BUILD)/cmake-user
	cmake -S examples/cmake -B $(BUILD)/cmake-user -DCMAKE_PREFIX_PATH=$(abspath $(BUILD)/stage) >/dev/null
	cmake --build $(BUILD)/cmake-user >/dev/null
	LD_LIBRARY_PATH=$(BUILD)/stage/lib $(BUILD)/cmake-user/version_cmake $(VERSION)
	@echo "install-check: pkg-config and CMake users build and run against the installed library"

test: deps build header-check header-compile symbols-check cargo-test nccl-real-test capi-test sim-gpu-test capi-valgrind install-check
	@echo "make test: all checks passed"

# The main job: a multi-process demo of the library at work.
run: build $(BUILD)/demo
	$(REL)/tc-run -n 4 -- $(BUILD)/demo

$(BUILD)/demo: examples/demo.c include/torchcomm.h
	@mkdir -p $(BUILD)
	$(CC) $(CTEST_CFLAGS) $< -o $@ $(CTEST_LIBS)

bench-store: build
	$(REL)/tc-store-bench

bench: bench-store bench-host bench-window

# One-sided windows through the C API: a ring of put + signal + wait on 2
# ranks (bench/window_bench.c), with the buffers from malloc (puts travel
# as messages) and from tc_mem_alloc (shared memory: puts are copies);
# tables on stdout and in bench/results/.
$(BUILD)/bench/window_bench: bench/window_bench.c include/torchcomm.h build
	@mkdir -p $(BUILD)/bench
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -Iinclude $< -o $@ -L$(REL) -ltorchcomm -Wl,-rpath,$(abspath $(REL))
bench-window: build $(BUILD)/bench/window_bench
	@mkdir -p bench/results
	@rc=0; : > bench/results/window_bench.txt; for m in 0 1; do \
	  $(REL)/tc-run -n 2 -- $(BUILD)/bench/window_bench -b 8 -e 16M -f 8 -n 50 -w 5 -m $$m > $(BUILD)/bench/window_bench.out || rc=1; \
	  sed 's/^\[0\] //' $(BUILD)/bench/window_bench.out | tee -a bench/results/window_bench.txt; done; exit $$rc

# Host comparison (tc-perf vs Gloo called directly), tables, CSV and plots
# under bench/results/. Not part of `make test`.
$(BUILD)/bench/gloo_direct: bench/gloo_direct.cc
	@mkdir -p $(BUILD)/bench
	$(CXX) -std=c++17 -O3 -Wall -Wextra $< -o $@ -lgloo -lpthread

# Open MPI, the figure to beat: only the benchmark needs it (not make test).
# Installed when run as root; otherwise printed, and the benchmark goes on
# without it.
BENCH_PACKAGES := libopenmpi-dev openmpi-bin
bench-deps:
	@missing=""; for p in $(BENCH_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "make bench-deps: installing$$missing"; \
	    (export DEBIAN_FRONTEND=noninteractive; apt-get install -y --no-install-recommends $$missing || \
	     (apt-get update && apt-get install -y --no-install-recommends $$missing)) >$(BENCH_LOG) 2>&1 \
	      || { tail -n 20 $(BENCH_LOG); echo "make bench-deps: Open MPI could not be installed; MPI will be skipped"; }; \
	  else \
	    echo "make bench-deps: for the MPI comparison install:$$missing (e.g. sudo apt-get install$$missing); MPI will be skipped"; \
	  fi; \
	fi
BENCH_LOG := /tmp/torchcomm-bench-deps.log

$(BUILD)/bench/mpi_allreduce: bench/mpi_allreduce.c
	@mkdir -p $(BUILD)/bench
	mpicc -std=c11 -O3 -Wall -Wextra $< -o $@

# mpi_allreduce is built only where mpicc and mpirun exist; host_compare.py
# skips MPI (and says so) when the binary is absent.
bench-host: build $(BUILD)/bench/gloo_direct bench-deps
	@python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q matplotlib 2>/dev/null || \
	  echo "bench: matplotlib could not be installed; plots will be skipped"
	@if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory $(BUILD)/bench/mpi_allreduce || echo "bench: mpi_allreduce did not build; MPI will be skipped"; \
	else rm -f $(BUILD)/bench/mpi_allreduce; echo "bench: mpicc/mpirun not found; MPI will be skipped"; fi
	python3 bench/host_compare.py --bin $(REL) --direct $(BUILD)/bench/gloo_direct \
	  --mpi $(BUILD)/bench/mpi_allreduce --out bench/results

clean:
	$(CARGO) clean
	rm -rf $(BUILD)

# GPU suite. `gpu-suite` (on a build machine with cargo) gathers into the
# ignored folder gpu-suite/ what the GPU machine needs (see
# capi_tests/gpu/make-gpu-suite.sh). There, with no cargo or make:
# `bash gpu-suite/run.sh` (part 1), `bash gpu-suite/run.sh part2`, or named
# tests (`bash gpu-suite/run.sh list`); `make gpu-test GPU_TESTS=all` where
# make exists. Not part of `make test`.
GPU_SUITE := gpu-suite
GPU_TESTS ?=
.PHONY: gpu-suite gpu-test
gpu-suite: build
	bash capi_tests/gpu/make-gpu-suite.sh $(GPU_SUITE)

gpu-test:
	bash $(GPU_SUITE)/run.sh $(GPU_TESTS)

# The GPU suite on a SIMULATED CUDA driver and one-rank NCCL (test doubles in
# tests/sim_gpu/, built here with $(CC)): runs our CUDA/NCCL code paths on a
# machine without a GPU. Not a GPU verification; part of `make test`.
.PHONY: sim-gpu-test
sim-gpu-test: build
	CC=$(CC) CARGO=$(CARGO) bash tests/sim_gpu/run-sim.sh

# GPU benchmark (on the GPU machine, from the repository root, no cargo):
# tc-perf -B nccl against raw NCCL (bench/nccl_raw.c, compiled there with cc)
# and torch.distributed, world size 1, all_reduce float32 sum 8 B..256 MiB,
# interleaved; tables, CSV and plots under gpu-suite/results/. Not part of
# `make test`. Options for bench/gpu_compare.py: GPU_BENCH_ARGS="--rounds 3".
.PHONY: gpu-bench
gpu-bench:
	bash $(GPU_SUITE)/bench/run-gpu-bench.sh $(GPU_SUITE)

# The real NCCL on a machine without a GPU. `nccl-wheel` fetches the
# nvidia-nccl-cu13 wheel of NCCL_WHEEL_VERSION (the GPU machine's, 2.28.9,
# whose x86-64 sha256 is pinned here; PyPI's listed sha256 is checked too)
# into the ignored $(NCCL_WHEEL_DIR) and keeps only libnccl.so.2 and nccl.h,
# reused from then on (pip when installed, else PyPI's JSON API with
# python3's urllib over HTTPS, hence ca-certificates in DEB_PACKAGES). When
# it cannot be had (no network, ...) it says why and `nccl-real-test` reports
# its checks SKIPPED with that reason; it never fails the build for it.
# `nccl-real-test` runs the loader's ABI test against that nccl.h,
# tests/nccl_unavailable.rs's real-library case and, through the C API,
# tests/nccl_abi/test_nccl_real.c (TC_ERR_UNAVAILABLE naming the NCCL
# version and the missing CUDA driver). Another version:
# make nccl-real-test NCCL_WHEEL_VERSION=2.32.3 (checked against PyPI's sha256).
NCCL_WHEEL_VERSION ?= 2.28.9
NCCL_WHEEL_SHA256_2.28.9_x86_64 := e4553a30f34195f3fa1da02a6da3d6337d28f2003943aa0a3d247bbc25fefc42
NCCL_WHEEL_DIR := target/nccl-wheel/$(NCCL_WHEEL_VERSION)
NCCL_LIB := $(NCCL_WHEEL_DIR)/lib/libnccl.so.2
NCCL_HDR := $(NCCL_WHEEL_DIR)/include/nccl.h
.PHONY: nccl-wheel nccl-real-test
nccl-wheel:
	@python3 tests/nccl_abi/fetch_wheel.py --version $(NCCL_WHEEL_VERSION) --out $(NCCL_WHEEL_DIR) \
	  --sha256 "$(NCCL_WHEEL_SHA256_$(NCCL_WHEEL_VERSION)_$(shell uname -m))" \
	  || echo "nccl-wheel: could not run tests/nccl_abi/fetch_wheel.py; the real-NCCL checks will be SKIPPED"

nccl-real-test: build nccl-wheel
	@if [ ! -f $(NCCL_LIB) ] || [ ! -f $(NCCL_HDR) ]; then \
	  echo "nccl-real-test: SKIPPED 3 checks (loader ABI against nccl.h, real libnccl in tests/nccl_unavailable.rs," \
	    "test_nccl_real.c): $$(cat $(NCCL_WHEEL_DIR)/SKIPPED 2>/dev/null || echo 'no wheel was fetched')"; \
	  exit 0; fi; \
	set -e; \
	TORCHCOMM_TEST_NCCL_HEADER=$(abspath $(NCCL_HDR)) \
	  $(CARGO) test --release --lib nccl::loader::tests::abi_matches_the_nccl_header -- --nocapture; \
	TORCHCOMM_TEST_NCCL_LIBRARY=$(abspath $(NCCL_LIB)) \
	  $(CARGO) test --release --test nccl_unavailable a_real_libnccl -- --nocapture; \
	mkdir -p $(BUILD)/nccl_abi; \
	$(CC) -std=c11 -Wall -Wextra -g -Iinclude -Icapi_tests -Itests/nccl_abi/cuda_stub -I$(NCCL_WHEEL_DIR)/include \
	  tests/nccl_abi/test_nccl_real.c -o $(BUILD)/nccl_abi/test_nccl_real $(CTEST_LIBS) -lpthread; \
	TC_TEST_BIN_DIR=$(abspath $(REL)) TORCHCOMM_NCCL_LIBRARY=$(abspath $(NCCL_LIB)) $(BUILD)/nccl_abi/test_nccl_real; \
	echo "nccl-real-test: NCCL $(NCCL_WHEEL_VERSION) from the wheel: ABI, loader and C API checks passed"
