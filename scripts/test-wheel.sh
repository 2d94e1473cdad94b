#!/usr/bin/env bash
# Usage: scripts/test-wheel.sh
# The wheel as a user meets it: scripts/build-wheel.sh builds it, a fresh
# virtual environment (python3 -m venv --system-site-packages, in a
# temporary folder outside the repository) installs it with pip offline
# (--no-index --no-deps), and with nothing from the build tree (no
# TORCHCOMM_LIBRARY, TORCHCOMM_GLOO_LIBRARY, LD_LIBRARY_PATH or PYTHONPATH;
# run from /tmp) the environment's tc-run starts 2 processes of its python
# doing a gloo all_reduce: each checks the sums, that the library it loaded
# is the one inside the installed package and that the gloo module came
# from there too. The installed libraries' dependencies must all resolve
# (ldd) and stay the documented ones (docs/python.md): the C runtime for
# libtorchcomm.so, plus libstdc++ and libgloo.so.0 for the gloo module. The
# environment is deleted afterwards. Prints SKIPPED with the reason when
# python3 -m venv or the gloo module is missing.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
fail() { echo "test-wheel: $*" >&2; exit 1; }
if [ ! -f "$REL/libtorchcomm-gloo.so" ]; then
  echo "test-wheel: SKIPPED: no libtorchcomm-gloo.so was built (libgloo-dev missing)"; exit 0
fi
wheel=$(bash scripts/build-wheel.sh | sed -n 's/^build-wheel: [^ ]* //p' | tail -n 1)
[ -f "$wheel" ] || fail "build-wheel.sh made no wheel"
tmp=$(mktemp -d /tmp/torchcomm-wheel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m venv --system-site-packages "$tmp/venv" >"$tmp/venv.log" 2>&1; then
  echo "test-wheel: SKIPPED: python3 -m venv failed (install python3-venv): $(tail -n 1 "$tmp/venv.log")"; exit 0
fi
unset TORCHCOMM_LIBRARY TORCHCOMM_GLOO_LIBRARY LD_LIBRARY_PATH PYTHONPATH
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$wheel" ||
  fail "pip install $wheel failed"
[ -x "$tmp/venv/bin/tc-run" ] || fail "the wheel did not install bin/tc-run"
pkg=$(cd /tmp && "$tmp/venv/bin/python" -c 'import os, torchcomm; print(os.path.dirname(torchcomm.__file__))')
case $pkg in "$tmp/venv/"*) ;; *) fail "torchcomm was imported from $pkg, not the new environment" ;; esac

# Dependencies: all found, and only the documented ones.
allowed='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libgcc_s\.so\.1|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2)$'
for f in libtorchcomm.so libtorchcomm-gloo.so; do
  deps=$(ldd "$pkg/$f") || fail "ldd $pkg/$f failed"
  ! grep -q "not found" <<<"$deps" || fail "$f has unresolved dependencies:"$'\n'"$deps"
  [ "$f" = libtorchcomm-gloo.so ] && allowed=${allowed%)\$}'|libstdc\+\+\.so\.6|libgloo\.so\.0)$'
  extra=$(readelf -d "$pkg/$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -Ev "$allowed" || true)
  [ -z "$extra" ] || fail "$f needs $extra, which docs/python.md does not list"
done

cat >"$tmp/allreduce.py" <<'PY'
import array, os, sys
import torchcomm as tc
comm = tc.Comm("gloo")
rank, size = comm.rank, comm.size
x = array.array("f", [rank + 1.0, 2.0 * rank, 1.0, 0.5])
comm.all_reduce(x, tc.ReduceOp.SUM)
want = [size * (size + 1) / 2, float(size * (size - 1)), float(size), size / 2]
assert list(x) == want, (list(x), want)
prefix = sys.argv[1]
lib = tc.library._name
assert lib.startswith(prefix) and lib.endswith("/torchcomm/libtorchcomm.so"), lib
maps = open("/proc/self/maps").read()
gloo = [l.split()[-1] for l in maps.splitlines() if l.endswith("libtorchcomm-gloo.so")]
assert gloo and all(g.startswith(prefix) for g in gloo), gloo
comm.finalize()
print(f"rank {rank} of {size}: all_reduce sums {list(x)}, library and gloo module from the wheel")
PY
out=$(cd /tmp && timeout 120 "$tmp/venv/bin/tc-run" -n 2 -- "$tmp/venv/bin/python" "$tmp/allreduce.py" "$tmp/venv/" 2>&1) ||
  fail "the 2-process all_reduce from the installed wheel failed:"$'\n'"$out"
for r in 0 1; do
  grep -q "rank $r of 2: all_reduce sums .*from the wheel" <<<"$out" || fail "rank $r printed:"$'\n'"$out"
done
echo "test-wheel: $(basename "$wheel"): pip install --no-index into a fresh venv, 2-process gloo all_reduce under its tc-run with the packaged libraries: passed"
