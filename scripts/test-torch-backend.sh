#!/usr/bin/env bash
# torch.distributed's "torchcomm" backend (python/torchcomm/distributed.py)
# with the real PyTorch. First its C++ implementation is compiled
# (scripts/build-torch-ext.sh: cached; SKIPPED without a compiler or torch
# headers, and then everything below runs on the Python implementation,
# which says so). Then, on the implementation torchcomm.distributed picks
# (C++ when built), under torchrun, one job per world size (2 and 4):
#  - tests/torch_backend/train.py parity: every collective against gloo's
#    answer; DDP (default, gradient_as_bucket_view, fp16-compress and
#    PowerSGD hooks) and FSDP2 training a small CNN and a small transformer
#    for 20 steps, our backend against gloo;
#  - tests/torch_backend/train.py killed: a rank leaves mid-backward, the
#    others get an error (never a hang); train.py late: monitored_barrier
#    names the rank that did not come in time;
#  - docs/python.md's DDP program under tc-run;
#  - the pip-installed package's entry point (torch.distributed.backends):
#    init_process_group("torchcomm") without importing torchcomm;
#  - a fixed subset of torch's own distributed suite on our backend
#    (tests/torch_backend/torch_suite.py --subset, 3 ranks; about 9 s a
#    test on a quiet 2-core machine: each spawns 3 processes importing torch),
#    and on the C++ implementation the subset torch gates to gloo by name
#    (--as-gloo --subset: sequence number, monitored_barrier, barrier timeout).
# When that is the C++ implementation, train.py parity on 2 ranks runs on the
# Python one as well (TORCHCOMM_TORCH_BACKEND=python), so the fallback stays
# tested; SUITE_PYTHON=1 runs the suite subset on it too (about 5 more
# minutes).
# Python with torch comes from scripts/torch-venv.sh; when it cannot be had,
# prints a SKIPPED line with the reason and exits 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rel="$root/target/release"
if ! py="$(bash scripts/torch-venv.sh 2>/tmp/torchcomm-venv.$$)"; then
  echo "test-torch-backend: SKIPPED (DDP, FSDP2 and torch's suite on the torchcomm backend):" \
    "$(grep -m1 SKIPPED /tmp/torchcomm-venv.$$ || echo 'scripts/torch-venv.sh failed')"
  rm -f /tmp/torchcomm-venv.$$; exit 0
fi
rm -f /tmp/torchcomm-venv.$$
set -e
torchrun="$(dirname "$py")/torchrun"
export TORCHCOMM_LIBRARY="$rel/libtorchcomm.so" PYTHONPATH="$root/python"
quiet() { grep -v '^\[W[0-9].*socket.cpp\|run.py:[0-9]*\] \*\|OMP_NUM_THREADS\|^W[0-9].*run.py:[0-9]*\] *$\|FutureWarning\|return func(\*args\|Work::is_success API\|Work::exception API' || true; }
echo "== the C++ implementation (python/torchcomm/csrc/backend.cpp)"
TORCHCOMM_TORCH_VENV="$(dirname "$(dirname "$py")")" bash scripts/build-torch-ext.sh
impl="$("$py" -c 'import torchcomm.distributed as d; print(d.implementation())' 2>&1 | tail -n 1)"
ext="$("$py" -c 'import torchcomm._torch_ext as e; print(e.find() or "")' 2>/dev/null || true)"
echo "torch.distributed's torchcomm backend here: the $impl implementation"
if [ "$impl" = cpp ]; then export TORCHCOMM_TORCH_EXT="$ext"; fi
for n in 2 4; do
  echo "== DDP, FSDP2 and the collectives against gloo, $n ranks"
  "$torchrun" --standalone --nproc-per-node "$n" tests/torch_backend/train.py parity 2>&1 | quiet
  echo "== a rank leaves mid-step, $n ranks"
  "$torchrun" --standalone --nproc-per-node "$n" tests/torch_backend/train.py killed 2>&1 | quiet
  echo "== monitored_barrier with a rank late, $n ranks"
  "$torchrun" --standalone --nproc-per-node "$n" tests/torch_backend/train.py late 2>&1 | quiet
done
if [ "$impl" = cpp ]; then
  echo "== the Python implementation (TORCHCOMM_TORCH_BACKEND=python): DDP, FSDP2 and the collectives, 2 ranks"
  TORCHCOMM_TORCH_BACKEND=python "$torchrun" --standalone --nproc-per-node 2 tests/torch_backend/train.py parity 2>&1 |
    quiet
fi
echo "== docs/python.md's DDP program on 2 ranks (tc-run: torch's store client on our server)"
mkdir -p build
awk '/^```py$/{f=1;next}/^```$/{f=0}f' docs/python.md > build/doc_ddp_program.py
test -s build/doc_ddp_program.py
"$rel/tc-run" -n 2 -- "$py" build/doc_ddp_program.py 2>&1 | quiet
echo "== the package's entry point: init_process_group(\"torchcomm\") with no import of torchcomm, 2 ranks"
site="$root/build/torch-backend-site"
rm -rf "$site"
"$py" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --target "$site" ./python
rm -rf python/build python/*.egg-info
PYTHONPATH="$site" "$rel/tc-run" -n 2 -- "$py" -c '
import sys, torch, torch.distributed as dist
dist.init_process_group("torchcomm")
assert "torchcomm" in sys.modules, "the backend did not come from the torchcomm package"
kind = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
want = {"cpp": "CppBackend", "python": "TorchCommBackend"}[sys.argv[1]]
assert kind == want, f"the entry point made a {kind}, not a {want}"
t = torch.ones(1); dist.all_reduce(t); assert t.item() == dist.get_world_size()
print(f"entry point: ok ({kind})"); dist.destroy_process_group()' "$impl" 2>&1 | quiet
echo "== torch's distributed suite, fixed subset, torchcomm backend"
# One line per test; when the run itself fails (an import error, a crash
# before the first test), its last lines too.
log=build/torch-suite-subset.log
status=0
"$py" tests/torch_backend/torch_suite.py --backend torchcomm --subset >"$log" 2>&1 || status=$?
grep '^PASS\|^FAIL\|^SKIP\|^KNOWN\|^torch_suite' "$log" || true
if [ "$status" != 0 ]; then
  echo "torch_suite.py exited with $status; its last lines ($log):"; tail -n 30 "$log"; exit 1
fi
if [ "$impl" = cpp ]; then
  # Tests torch gates to gloo by name, run on ours (--as-gloo): the group's
  # sequence number and monitored_barrier's errors, which only the C++
  # implementation has as gloo's.
  echo "== torch's distributed suite, gloo-gated subset, torchcomm backend (--as-gloo)"
  log=build/torch-suite-as-gloo.log
  "$py" tests/torch_backend/torch_suite.py --backend torchcomm --as-gloo --subset >"$log" 2>&1 ||
    { grep '^FAIL\|^torch_suite' "$log"; tail -n 30 "$log"; exit 1; }
  grep '^PASS\|^FAIL\|^SKIP\|^KNOWN\|^torch_suite' "$log" || true
fi
if [ "$impl" = cpp ] && [ "${SUITE_PYTHON:-0}" = 1 ]; then
  echo "== torch's distributed suite, fixed subset, torchcomm backend, Python implementation"
  log=build/torch-suite-subset-python.log
  TORCHCOMM_TORCH_BACKEND=python "$py" tests/torch_backend/torch_suite.py --backend torchcomm --subset >"$log" 2>&1 ||
    { grep '^FAIL\|^torch_suite' "$log"; tail -n 30 "$log"; exit 1; }
  grep '^PASS\|^FAIL\|^SKIP\|^KNOWN\|^torch_suite' "$log" || true
fi
echo "test-torch-backend: all passed"
