#!/usr/bin/env bash
# Usage: scripts/test-wheel.sh
# The wheel as a user meets it: scripts/build-wheel.sh builds it, a fresh
# virtual environment (python3 -m venv --system-site-packages, in a
# temporary folder outside the repository) installs it with pip offline
# (--no-index --no-deps), and with nothing from the build tree (no
# TORCHCOMM_LIBRARY, TORCHCOMM_GLOO_LIBRARY, LD_LIBRARY_PATH or PYTHONPATH;
# run from /tmp):
#  - the installed libraries' dependencies all resolve (ldd): the system's
#    own (WHEEL_SYSTEM_LIBS, scripts/common.sh) and, for the gloo module,
#    every other one inside the package's .libs/;
#  - the environment's tc-run starts 2 processes of its python doing a gloo
#    all_reduce: each checks the sums, that the library it loaded is the one
#    inside the installed package, that the gloo module and libgloo came from
#    there too and that none of the system's copies of the vendored
#    libraries is mapped (/proc/self/maps);
#  - the same run in a mount namespace (unshare) where each system copy of
#    those libraries (libgloo.so.0 and what it pulls in) reads as an empty
#    file, so loading one fails: the machine as one without libgloo0
#    (skipped, saying so, where unshare --mount is not allowed);
#  - with torch (scripts/torch-venv.sh; SKIPPED without it): a second fresh
#    venv seeing torch's environment through a .pth file installs the wheel;
#    2 ranks under its tc-run with an empty cache (XDG_CACHE_HOME) call
#    init_process_group("torchcomm"): the C++ backend is compiled once (one
#    rank compiles, the other waits on the lock) into the cache and both use
#    it (CppBackend; is_completed() on an asynchronous all_reduce's work);
#    then in one process: the switches (TORCHCOMM_TORCH_BACKEND=python builds
#    nothing, TORCHCOMM_TORCH_EXT names the module) and the fallbacks to the
#    Python backend with a warning naming why (no compiler; the compiler
#    failed, not retried by the next process), TORCHCOMM_TORCH_BACKEND=cpp
#    raising then. The compile takes 25 s to a few minutes here.
# The environments are deleted afterwards. Prints SKIPPED with the reason
# when python3 -m venv or the gloo module is missing.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
fail() { echo "test-wheel: $*" >&2; exit 1; }
if [ ! -f "$REL/libtorchcomm-gloo.so" ]; then
  echo "test-wheel: SKIPPED: no libtorchcomm-gloo.so was built (libgloo-dev missing)"; exit 0
fi
wheel=$(bash scripts/build-wheel.sh | sed -n 's/^build-wheel: [^ ]* //p' | tail -n 1)
[ -f "$wheel" ] || fail "build-wheel.sh made no wheel"
# The system's copies of what the wheel must carry: the build tree's gloo
# module resolves them from the system.
hidden=$(ldd "$REL/libtorchcomm-gloo.so" | sed -n 's/^[[:space:]]*\([^ ]*\) => \(\/[^ ]*\) .*/\1 \2/p' |
  while read -r soname path; do grep -Eq "$WHEEL_SYSTEM_LIBS" <<<"$soname" || readlink -f "$path"; done)
grep -q libgloo <<<"$hidden" || fail "ldd shows no system libgloo under $REL/libtorchcomm-gloo.so"
tmp=$(mktemp -d /tmp/torchcomm-wheel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m venv --system-site-packages "$tmp/venv" >"$tmp/venv.log" 2>&1; then
  echo "test-wheel: SKIPPED: python3 -m venv failed (install python3-venv): $(tail -n 1 "$tmp/venv.log")"; exit 0
fi
unset TORCHCOMM_LIBRARY TORCHCOMM_GLOO_LIBRARY LD_LIBRARY_PATH PYTHONPATH TORCHCOMM_TORCH_EXT TORCHCOMM_TORCH_BACKEND
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$wheel" ||
  fail "pip install $wheel failed"
[ -x "$tmp/venv/bin/tc-run" ] || fail "the wheel did not install bin/tc-run"
pkg=$(cd /tmp && "$tmp/venv/bin/python" -c 'import os, torchcomm; print(os.path.dirname(torchcomm.__file__))')
case $pkg in "$tmp/venv/"*) ;; *) fail "torchcomm was imported from $pkg, not the new environment" ;; esac

# Dependencies: all found; outside the system's own, only inside .libs/.
for f in libtorchcomm.so libtorchcomm-gloo.so "$pkg"/.libs/*; do
  f=${f#"$pkg/"}
  deps=$(ldd "$pkg/$f") || fail "ldd $pkg/$f failed"
  ! grep -q "not found" <<<"$deps" || fail "$f has unresolved dependencies:"$'\n'"$deps"
  while read -r soname path; do
    grep -Eq "$WHEEL_SYSTEM_LIBS" <<<"$soname" && continue
    [ "$f" != libtorchcomm.so ] || fail "libtorchcomm.so needs $soname, outside the system's libraries"
    case $(readlink -f "$path") in "$pkg/.libs/"*) ;; *) fail "$f resolves $soname to $path, not into $pkg/.libs" ;; esac
  done < <(sed -n 's/^[[:space:]]*\([^ ]*\) => \(\/[^ ]*\) .*/\1 \2/p' <<<"$deps")
done
ls "$pkg"/.libs/libgloo-*.so.0 >/dev/null 2>&1 || fail "the wheel carries no libgloo in $pkg/.libs"

cat >"$tmp/allreduce.py" <<'PY'
import array, os, sys
import torchcomm as tc
comm = tc.Comm("gloo")
rank, size = comm.rank, comm.size
x = array.array("f", [rank + 1.0, 2.0 * rank, 1.0, 0.5])
comm.all_reduce(x, tc.ReduceOp.SUM)
want = [size * (size + 1) / 2, float(size * (size - 1)), float(size), size / 2]
assert list(x) == want, (list(x), want)
prefix, system_copies = sys.argv[1], sys.argv[2].split()
lib = tc.library._name
assert lib.startswith(prefix) and lib.endswith("/torchcomm/libtorchcomm.so"), lib
mapped = {l.split()[-1] for l in open("/proc/self/maps").read().splitlines() if "/" in l}
gloo = [m for m in mapped if m.endswith("libtorchcomm-gloo.so")]
assert gloo and all(g.startswith(prefix) for g in gloo), gloo
libgloo = [m for m in mapped if os.path.basename(m).startswith("libgloo")]
assert libgloo and all(m.startswith(prefix) and "/torchcomm/.libs/" in m for m in libgloo), libgloo
assert not mapped & set(system_copies), sorted(mapped & set(system_copies))
comm.finalize()
print(f"rank {rank} of {size}: all_reduce sums {list(x)}, library, gloo module and libgloo from the wheel")
PY
allreduce() {
  out=$(cd /tmp && timeout 120 "$tmp/venv/bin/tc-run" -n 2 -- "$tmp/venv/bin/python" "$tmp/allreduce.py" \
    "$tmp/venv/" "$(echo $hidden)" 2>&1) || fail "the 2-process all_reduce from the installed wheel $1 failed:"$'\n'"$out"
  for r in 0 1; do
    grep -q "rank $r of 2: all_reduce sums .*from the wheel" <<<"$out" || fail "rank $r ($1) printed:"$'\n'"$out"
  done
}
allreduce "with the system's libgloo installed"
echo "test-wheel: 2-process gloo all_reduce from the wheel, its vendored libgloo mapped, no system copy: passed"

# The machine without libgloo: its files (and those it pulls in) read empty.
export -f allreduce fail
export tmp hidden
if unshare --mount --propagation private true 2>/dev/null; then
  unshare --mount --propagation private bash -c '
    set -euo pipefail
    for f in $hidden; do mount --bind /dev/null "$f"; done
    if python3 -c "import ctypes; ctypes.CDLL(\"$(echo "$hidden" | head -n 1)\")" 2>/dev/null; then
      fail "binding /dev/null over $(echo "$hidden" | head -n 1) did not hide it"
    fi
    allreduce "with the system copies of $(echo $hidden | wc -w) libraries unloadable"' ||
    fail "the run without the system's libgloo failed"
  echo "test-wheel: the same with the system's $(basename -a $hidden | paste -sd' ') unloadable (mount namespace): passed"
else
  echo "test-wheel: the run with the system's libgloo hidden SKIPPED: unshare --mount is not allowed here (needs root)"
fi

# torch.distributed's C++ backend, compiled on first use from the wheel.
if ! torch_py=$(bash scripts/torch-venv.sh 2>"$tmp/torch-venv.log"); then
  echo "test-wheel: the torch backend part SKIPPED: $(grep -m1 SKIPPED "$tmp/torch-venv.log" || echo 'scripts/torch-venv.sh failed')"
  echo "test-wheel: $(basename "$wheel"): passed (without torch)"
  exit 0
fi
"$torch_py" -m venv "$tmp/tvenv" >"$tmp/venv.log" 2>&1 || fail "$torch_py -m venv failed: $(tail -n 1 "$tmp/venv.log")"
torch_site=$("$torch_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$tmp/tvenv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$tmp/site"
echo "$torch_site" >"$(cat "$tmp/site")/torch-environment.pth"
"$tmp/tvenv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$wheel" ||
  fail "pip install $wheel (torch environment) failed"
cat >"$tmp/torch_backend.py" <<'PY'
import os, sys, torch, torch.distributed as dist
import torchcomm.distributed as tcd
prefix = sys.argv[1]
assert tcd.__file__.startswith(prefix), tcd.__file__
dist.init_process_group("torchcomm")
rank, size = dist.get_rank(), dist.get_world_size()
kind = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
assert kind == "CppBackend", kind
ext = tcd._extension().__file__
cache = os.path.join(os.environ["XDG_CACHE_HOME"], "torchcomm", "torch-ext")
assert ext.startswith(cache + "/"), (ext, cache)
t = torch.full((1024,), rank + 1.0)
work = dist.all_reduce(t, async_op=True)
work.wait()
assert work.is_completed(), "is_completed() stayed False (the Python backend's works do)"
assert bool((t == size * (size + 1) / 2).all()), t[:4]
dist.destroy_process_group()
print(f"rank {rank}: {kind} from {ext}: async all_reduce completed")
PY
export XDG_CACHE_HOME="$tmp/cache"
t0=$(date +%s)
out=$(cd /tmp && timeout 900 "$tmp/tvenv/bin/tc-run" -n 2 -- "$tmp/tvenv/bin/python" "$tmp/torch_backend.py" "$tmp/tvenv/" 2>&1) ||
  fail "torch.distributed on the wheel's backend failed:"$'\n'"$out"
for r in 0 1; do grep -q "rank $r: CppBackend from .*completed" <<<"$out" || fail "rank $r printed:"$'\n'"$out"; done
compiles=$(grep -c "compiling backend.cpp" <<<"$out" || true)
[ "$compiles" = 1 ] || fail "2 ranks starting together compiled the extension $compiles times, not once:"$'\n'"$out"
echo "test-wheel: torch.distributed's C++ backend compiled once on first use into the cache by 2 ranks, used by both: passed ($(( $(date +%s) - t0 )) s)"

built=$(ls "$XDG_CACHE_HOME"/torchcomm/torch-ext/*/torchcomm_torch_ext.so)
cat >"$tmp/switches.py" <<'PY'
import logging, os, sys
import torchcomm.distributed as tcd
built, tmp = sys.argv[1], sys.argv[2]
warnings = []
logging.getLogger("torchcomm.distributed").addHandler(
    type("H", (logging.Handler,), {"emit": lambda self, r: warnings.append(r.getMessage())})())

def case(cache, **env):
    """implementation() afresh with XDG_CACHE_HOME=cache and env set."""
    for k in ("CXX", "TORCHCOMM_TORCH_BACKEND", "TORCHCOMM_TORCH_EXT"):
        os.environ.pop(k, None)
    os.environ.update(env, XDG_CACHE_HOME=os.path.join(tmp, cache))
    tcd._ext = None
    warnings.clear()
    return tcd.implementation()

assert case("c1", TORCHCOMM_TORCH_BACKEND="python") == "python"
assert not os.path.exists(os.path.join(tmp, "c1")), "TORCHCOMM_TORCH_BACKEND=python built the extension"
assert case("c2", TORCHCOMM_TORCH_EXT=built) == "cpp" and tcd._extension().__file__ == built
assert not os.path.exists(os.path.join(tmp, "c2")), "TORCHCOMM_TORCH_EXT did not spare the build"
assert case("c3", CXX="/nonexistent/g++") == "python"
assert any("no C++ compiler" in w for w in warnings), warnings
try:
    case("c3", CXX="/nonexistent/g++", TORCHCOMM_TORCH_BACKEND="cpp")
    raise AssertionError("TORCHCOMM_TORCH_BACKEND=cpp without a compiler did not raise")
except RuntimeError as e:
    assert "no C++ compiler" in str(e), e
assert case("c4", CXX="false") == "python"  # a compiler that fails
assert any("false exited with 1" in w for w in warnings), warnings
assert case("c4", CXX="false") == "python"  # the next process does not compile again
assert any("failed before" in w for w in warnings) and not any("compiling backend.cpp" in w for w in warnings), warnings
print("switches and fallbacks: ok")
PY
out=$(cd /tmp && "$tmp/tvenv/bin/python" "$tmp/switches.py" "$built" "$tmp" 2>&1) ||
  fail "the switches or the fallbacks misbehaved:"$'\n'"$out"
grep -q "switches and fallbacks: ok" <<<"$out" || fail "switches.py printed:"$'\n'"$out"
echo "test-wheel: TORCHCOMM_TORCH_BACKEND=python|cpp, TORCHCOMM_TORCH_EXT, the fallback with no compiler and with a failing one: passed"
echo "test-wheel: $(basename "$wheel"): passed"
