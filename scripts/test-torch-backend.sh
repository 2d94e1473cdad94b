#!/usr/bin/env bash
# torch.distributed's "torchcomm" backend (python/torchcomm/distributed.py)
# with the real PyTorch, under torchrun, one job per world size (2 and 4):
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
#    test on a quiet 2-core machine: each spawns 3 processes importing torch).
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
quiet() { grep -v '^\[W[0-9].*socket.cpp\|run.py:[0-9]*\] \*\|OMP_NUM_THREADS\|^W[0-9].*run.py:[0-9]*\] *$\|FutureWarning\|return func(\*args' || true; }
for n in 2 4; do
  echo "== DDP, FSDP2 and the collectives against gloo, $n ranks"
  "$torchrun" --standalone --nproc-per-node "$n" tests/torch_backend/train.py parity 2>&1 | quiet
  echo "== a rank leaves mid-step, $n ranks"
  "$torchrun" --standalone --nproc-per-node "$n" tests/torch_backend/train.py killed 2>&1 | quiet
  echo "== monitored_barrier with a rank late, $n ranks"
  "$torchrun" --standalone --nproc-per-node "$n" tests/torch_backend/train.py late 2>&1 | quiet
done
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
t = torch.ones(1); dist.all_reduce(t); assert t.item() == dist.get_world_size()
print("entry point: ok"); dist.destroy_process_group()' 2>&1 | quiet
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
echo "test-torch-backend: all passed"
