#!/usr/bin/env bash
# The Python package (python/): installed with pip into a scratch folder
# (pure Python, no compiler), then its pytest suite run on 2 and 3 ranks
# through tc-run, the library found once through TORCHCOMM_LIBRARY and once
# by its own search (the build tree); then docs/python.md's program and
# examples/python/train.py on 2 ranks. Python with numpy, torch and pytest
# comes from scripts/torch-venv.sh; when it cannot be had, prints a SKIPPED
# line with the reason and exits 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rel="$root/target/release"
if ! py="$(bash scripts/torch-venv.sh 2>/tmp/torchcomm-venv.$$)"; then
  echo "test-python: SKIPPED (pytest suite and training example): $(grep -m1 SKIPPED /tmp/torchcomm-venv.$$ || echo 'scripts/torch-venv.sh failed')"
  rm -f /tmp/torchcomm-venv.$$; exit 0
fi
rm -f /tmp/torchcomm-venv.$$
set -e
site="$root/build/python-site"
rm -rf "$site" "$root/build/python-build"
# --no-build-isolation: setuptools from the environment, no download.
"$py" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --target "$site" ./python
rm -rf python/build python/*.egg-info
test -f "$site/torchcomm/py.typed"
export PYTHONPATH="$site"
# The installed copy, not the source tree, is what gets imported.
"$py" -c "import torchcomm, sys; assert torchcomm.__file__.startswith('$site'), torchcomm.__file__"
(unset TORCHCOMM_LIBRARY; "$py" -c "import torchcomm; print('test-python: library found at', torchcomm.library._name)")
for n in 2 3; do
  echo "== pytest python/tests on $n ranks"
  TORCHCOMM_LIBRARY="$rel/libtorchcomm.so" "$rel/tc-run" -n "$n" -- \
    "$py" -m pytest -q -p no:cacheprovider python/tests \
    --ignore python/tests/test_torchcomms.py --ignore python/tests/test_torch_store.py  # scripts/test-torchcomms.sh
done
echo "== docs/python.md's program on 2 ranks"
awk '/^```python$/{f=1;next}/^```$/{f=0}f' docs/python.md > "$root/build/doc_program.py"
test -s "$root/build/doc_program.py"
"$rel/tc-run" -n 2 -- "$py" "$root/build/doc_program.py"
echo "== examples/python/train.py on 2 ranks"
"$rel/tc-run" -n 2 -- "$py" examples/python/train.py
echo "test-python: pip install, pytest on 2 and 3 ranks, docs/python.md program, training example: all passed"
