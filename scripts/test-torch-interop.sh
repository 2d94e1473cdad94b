#!/usr/bin/env bash
# libtorchcomm against the real PyTorch (tests/torch_interop/interop.py):
#  - stores both ways: torch's TCPStore client against our server, our client
#    against torch's server (libuv and classic), every command both
#    implement, PrefixStore, several clients at once;
#  - torch's gloo process group bootstrapped through tc-run (2 and 3 ranks);
#  - torch.distributed and torchcomm side by side in the same processes over
#    one store, results compared, under tc-run (our store server) and under
#    torchrun (torch's);
#  - our C program (examples/demo.c), our C++ example and our Python package
#    (examples/python/train.py) launched by torchrun, with the static and the
#    c10d (--standalone) rendezvous;
#  - two hosts made of network namespaces, torchrun --nnodes 2 with the c10d
#    rendezvous (scripts/test-two-hosts.sh; SKIPPED when not root).
# Python with torch comes from scripts/torch-venv.sh; when it cannot be had,
# prints a SKIPPED line with the reason and exits 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rel="$root/target/release"
if ! py="$(bash scripts/torch-venv.sh 2>/tmp/torchcomm-venv.$$)"; then
  echo "test-torch-interop: SKIPPED (stores both ways, gloo under tc-run, torchrun launches, mixed jobs):" \
    "$(grep -m1 SKIPPED /tmp/torchcomm-venv.$$ || echo 'scripts/torch-venv.sh failed')"
  rm -f /tmp/torchcomm-venv.$$; exit 0
fi
rm -f /tmp/torchcomm-venv.$$
set -e
torchrun="$(dirname "$py")/torchrun"
export TORCHCOMM_LIBRARY="$rel/libtorchcomm.so" PYTHONPATH="$root/python"
interop=tests/torch_interop/interop.py
quiet() { grep -v '^\[W[0-9].*socket.cpp\|^\(\[[0-9]\] \)\?ok \|run.py:[0-9]*\] \*\|OMP_NUM_THREADS\|^W[0-9].*run.py:[0-9]*\] *$' || true; }

echo "== stores: torch <-> torchcomm, both directions"
"$py" "$interop" stores 2>&1 | quiet
for n in 2 3; do
  echo "== torch gloo process group under tc-run, $n ranks"
  "$rel/tc-run" -n "$n" -- "$py" "$interop" gloo-pg | quiet
done
echo "== torch.distributed and torchcomm in one job, tc-run (our store server), 3 ranks"
"$rel/tc-run" -n 3 -- "$py" "$interop" mixed | quiet
echo "== the same under torchrun (torch's store server), 2 ranks"
"$torchrun" --standalone --nproc-per-node 2 "$interop" mixed 2>&1 | quiet

mkdir -p build/interop
cc -std=c11 -Wall -Wextra -Werror -Iinclude examples/demo.c -o build/interop/demo \
  -L"$rel" -ltorchcomm -Wl,-rpath,"$rel"
c++ -std=c++17 -Wall -Wextra -Werror -Iinclude examples/cpp/hello.cpp -o build/interop/hello \
  -L"$rel" -ltorchcomm -Wl,-rpath,"$rel"
port=$(( 20000 + RANDOM % 20000 ))
echo "== torchrun --no-python examples/demo.c, static rendezvous, 3 ranks"
"$torchrun" --nnodes 1 --nproc-per-node 3 --master-port "$port" --no-python build/interop/demo 2>&1 | quiet
echo "== torchrun --no-python examples/cpp/hello.cpp, c10d rendezvous, 2 ranks"
"$torchrun" --standalone --nproc-per-node 2 --no-python build/interop/hello 2>&1 | quiet
echo "== torchrun examples/python/train.py (the torchcomm package), c10d rendezvous, 2 ranks"
"$torchrun" --standalone --nproc-per-node 2 examples/python/train.py 2>&1 | quiet
echo "== two hosts (network namespaces): torchrun --nnodes 2, c10d rendezvous"
bash scripts/test-two-hosts.sh
echo "test-torch-interop: all passed"
