#!/usr/bin/env bash
# The C++ interface (include/torchcomm.hpp): tests/cpp/test_cpp.cpp built as
# C++17 and C++20 with -Wall -Wextra -Werror -pedantic (tests/cpp/
# test_cpp_local.cpp, tc::Local, only compiled: it runs on the simulated
# driver in make sim-gpu-test), run on 2 and 3 ranks
# through tc-run and once more on 2 ranks under valgrind (no errors, no
# definite or indirect leaks); then the header installed into a scratch
# prefix with examples/cpp/hello.cpp built against it through pkg-config and
# CMake and run on 3 ranks; docs/cpp.md's program built and run on 2 ranks.
# Needs target/release built (make build).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rel="$root/target/release"
out="$root/build/cpp"
CXX="${CXX:-c++}"
mkdir -p "$out"
flags=(-Wall -Wextra -Werror -pedantic -g -Iinclude)
libs=(-L"$rel" -ltorchcomm -Wl,-rpath,"$rel")

for std in 17 20; do
  "$CXX" -std=c++$std "${flags[@]}" tests/cpp/test_cpp.cpp -o "$out/test_cpp$std" "${libs[@]}"
  # tc::Local's test needs a CUDA driver: it runs in make sim-gpu-test; compiled here.
  "$CXX" -std=c++$std "${flags[@]}" -Itests/sim_gpu -fsyntax-only tests/cpp/test_cpp_local.cpp
done
for std in 17 20; do
  for n in 2 3; do
    echo "== test_cpp C++$std on $n ranks"
    "$rel/tc-run" -n "$n" -- "$out/test_cpp$std"
  done
done

# docs/cpp.md's complete program, exactly as written there.
awk '/^```cpp$/{f=1;next}/^```$/{f=0}f' docs/cpp.md > "$out/doc_program.cpp"
test -s "$out/doc_program.cpp"
"$CXX" -std=c++17 "${flags[@]}" "$out/doc_program.cpp" -o "$out/doc_program" "${libs[@]}"
echo "== docs/cpp.md's program on 2 ranks"
"$rel/tc-run" -n 2 -- "$out/doc_program"

if command -v valgrind >/dev/null; then
  echo "== test_cpp C++17 on 2 ranks under valgrind"
  TC_UNDER_VALGRIND=1 "$rel/tc-run" -n 2 -- valgrind -q --suppressions=scripts/valgrind-gloo.supp --error-exitcode=99 --leak-check=full \
    --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect "$out/test_cpp17"
else
  echo "test-cpp: SKIPPED the valgrind run: valgrind not installed (make deps installs it)"
fi

# Installed beside torchcomm.h; found through pkg-config and CMake.
stage="$root/build/cpp-stage"
rm -rf "$stage"
make --no-print-directory install PREFIX="$stage" >/dev/null
test -f "$stage/include/torchcomm.hpp"
test -f "$stage/include/torchcomm_base.hpp"
export PKG_CONFIG_PATH="$stage/lib/pkgconfig"
# shellcheck disable=SC2046
"$CXX" -std=c++17 -Wall -Wextra -Werror examples/cpp/hello.cpp -o "$out/hello_pc" \
  $(pkg-config --cflags --libs torchcomm)
echo "== examples/cpp/hello.cpp (pkg-config) on 3 ranks"
LD_LIBRARY_PATH="$stage/lib" "$rel/tc-run" -n 3 -- "$out/hello_pc"
if command -v cmake >/dev/null; then
  rm -rf "$out/cmake-user"
  cmake -S examples/cpp -B "$out/cmake-user" -DCMAKE_PREFIX_PATH="$stage" >/dev/null
  cmake --build "$out/cmake-user" >/dev/null
  echo "== examples/cpp/hello.cpp (CMake) on 2 ranks"
  LD_LIBRARY_PATH="$stage/lib" "$rel/tc-run" -n 2 -- "$out/cmake-user/hello"
else
  echo "test-cpp: SKIPPED the CMake build: cmake not installed (make deps installs it)"
fi
make --no-print-directory uninstall PREFIX="$stage" >/dev/null
test ! -e "$stage/include/torchcomm.hpp"
test ! -e "$stage/include/torchcomm_base.hpp"
echo "test-cpp: C++17 and C++20 on 2 and 3 ranks, docs/cpp.md program, valgrind, pkg-config and CMake users: all passed"
