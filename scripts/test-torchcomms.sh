#!/usr/bin/env bash
# torchcomm.torchcomms (torchcomms' Python API) on real processes:
#  - python/tests/test_torchcomms.py and test_torch_store.py under tc-run (2
#    and 4 ranks) and under torchrun (3 ranks);
#  - seed 004's examples (python/tests/torchcomms_examples/, changed only as
#    their headers say) under tc-run and torchrun.
# Python with torch comes from scripts/torch-venv.sh; when it cannot be had,
# prints a SKIPPED line with the reason and exits 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rel="$root/target/release"
if ! py="$(bash scripts/torch-venv.sh 2>/tmp/torchcomm-venv.$$)"; then
  echo "test-torchcomms: SKIPPED (torchcomms API tests and seed examples):" \
    "$(grep -m1 SKIPPED /tmp/torchcomm-venv.$$ || echo 'scripts/torch-venv.sh failed')"
  rm -f /tmp/torchcomm-venv.$$; exit 0
fi
rm -f /tmp/torchcomm-venv.$$
set -e
torchrun="$(dirname "$py")/torchrun"
export TORCHCOMM_LIBRARY="$rel/libtorchcomm.so" PYTHONPATH="$root/python" OMP_NUM_THREADS=1
tmp="$(mktemp -d /tmp/tc-torchcomms.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
tests=(python/tests/test_torchcomms.py python/tests/test_torch_store.py)
for n in 2 4; do
  echo "== torchcomms API tests, tc-run, $n ranks"
  "$rel/tc-run" -n "$n" -- "$py" -m pytest -q -p no:cacheprovider "${tests[@]}" | grep -v '^\[[1-9]\]' || exit 1
done
echo "== torchcomms API tests, torchrun, 3 ranks"
"$torchrun" --standalone --nproc-per-node 3 -m pytest -q -p no:cacheprovider "${tests[@]}" 2>&1 |
  grep -E 'passed|failed|error' || exit 1
ex=python/tests/torchcomms_examples
for launcher in tc-run torchrun; do
  for example in basic_usage async_operations custom_options; do
    n=2; [ "$example" = custom_options ] && n=3
    export TC_EXAMPLE_FILESTORE="$tmp/$launcher-$example"
    echo "== seed 004 example $example, $launcher, $n ranks"
    if [ "$launcher" = tc-run ]; then
      "$rel/tc-run" -n "$n" -- "$py" "$ex/$example.py"
    else
      "$torchrun" --standalone --nproc-per-node "$n" "$ex/$example.py"
    fi
  done
done
echo "test-torchcomms: API tests (tc-run 2 and 4 ranks, torchrun 3) and seed 004's examples: all passed"
