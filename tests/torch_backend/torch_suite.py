"""torch's own distributed test suite (DistributedTest._DistTestBase of the
wheel's torch/testing/_internal/distributed/distributed_test.py) on a backend,
the way torch's test/distributed/test_distributed_spawn.py runs it: a class
deriving from TestDistBackend and the test base, whose setUp spawns
WORLD_SIZE processes; BACKEND, WORLD_SIZE and TEMP_DIR steer it.

    torch_suite.py --backend torchcomm|gloo [--world N] [--subset | -k PATTERN ... | --all]
                   [--results FILE.json]

--subset runs the fixed list SUBSET below (collectives, new_group, DDP with
hooks and bucket views; `make test`), with --as-gloo AS_GLOO_SUBSET; --all
every test (`make torch-suite`).
For "torchcomm" the backend is registered (import torchcomm.distributed) and
marked as having torch's "ddp", "subgroup" and "plugin" features before the
suite is imported; the
implementation (C++ or Python, TORCHCOMM_TORCH_BACKEND) is named in the
output, and KNOWN_FAILURES has a list for each. Prints
one line per test (PASS, FAIL, SKIP with the reason) and a summary; --results
writes {test: [status, reason]}. Exit status 1 when a test failed.
"""
import argparse
import json
import os
import sys
import tempfile
import time
import unittest

SUBSET = [
    # collectives (the suite's `_group` variants skip below 8 ranks; its
    # CPU all_to_all and all_reduce_coalesced tests run on MPI or gloo only)
    "test_broadcast", "test_reduce_sum", "test_reduce_max", "test_all_reduce_sum", "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex", "test_all_reduce_product", "test_scatter", "test_gather", "test_all_gather",
    "test_all_gather_coalesced_simple", "test_barrier", "test_send_recv", "test_send_recv_with_tag", "test_send_recv_any_source", "test_isend",
    "test_irecv", "test_coalescing_manager", "test_broadcast_object_list", "test_all_gather_object_default_pg",
    # groups
    "test_new_subgroups", "test_new_subgroups_by_enumeration", "test_get_rank_size_group", "test_destroy_group",
    # DDP: hooks and bucket views
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_ddp_hook_parity_allreduce", "test_ddp_hook_parity_allreduce_process_group",
    "test_ddp_hook_parity_powerSGD", "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_grad_is_view", "test_get_future", "test_ddp_comm_hook_logging",
]

# --as-gloo --subset: tests the suite gates to gloo by name and that check
# what a gloo group does: the group's sequence number (an object collective
# on a subgroup), monitored_barrier's errors, a barrier's timeout error.
AS_GLOO_SUBSET = [
    "test_all_gather_object_subgroup", "test_monitored_barrier_gloo", "test_monitored_barrier_gloo_subgroup",
    "test_monitored_barrier_gloo_rank_0_timeout", "test_barrier_timeout_full_group",
]

# Tests of SUBSET that fail on the torchcomm backend for a reason docs/status.md
# lists, per implementation of the backend (torchcomm.distributed picks the
# C++ one when its extension loads; TORCHCOMM_TORCH_BACKEND forces one):
# reported as KNOWN, not failing the run; one that starts to pass fails it,
# so that these lists stay true.
# torch's DDP logger names the process group's backend by its c10d type,
# "custom" for every third-party backend, where the test expects the
# registered name (dist.get_backend): torch's, for any plugin backend.
_DDP_LOGGING = {
    "test_ddp_logging_data_cpu": "torch's DDP logging data names every third-party backend 'custom' "
                                 "(ProcessGroup::getBackendName of a CUSTOM type), the test expects 'torchcomm'",
}
KNOWN_FAILURES = {
    "cpp": dict(_DDP_LOGGING),
    "python": {
        **{
            name: "is_completed() stays False after wait(): torch's holder of Python works routes only wait() and "
                  "get_future() (docs/status.md; the C++ implementation has no such gap)"
            for name in ("test_isend", "test_irecv")
        },
        **{
            name: "the sender of a receive from any source cannot be had: torch's holder of Python works routes "
                  "only wait() and get_future(), not sourceRank() (the C++ implementation passes)"
            for name in ("test_send_recv_any_source", "test_send_recv_any_source_autograd_profiler",
                         "test_send_recv_any_source_torch_profiler")
        },
        **_DDP_LOGGING,
    },
}


def settle_known_failures(results, known):
    for name, why in known.items():
        status = results.get(name)
        if status and status[0] == "FAIL":
            results[name] = ["KNOWN", f"{why}: {status[1]}"]
        elif status and status[0] == "PASS":
            results[name] = ["FAIL", f"passes, yet listed in KNOWN_FAILURES ({why}): remove it there"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", required=True, choices=["torchcomm", "gloo"])
    p.add_argument("--world", type=int, default=3)
    p.add_argument("--subset", action="store_true")
    p.add_argument("--all", action="store_true")
    p.add_argument("-k", action="append", default=[], help="run the tests whose name contains this")
    p.add_argument("--results")
    p.add_argument("--as-gloo", action="store_true",
                   help="select the tests as for gloo (lifts the suite's gate on backend names), run them on ours")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="torchcomm-suite-")
    os.environ.update(BACKEND=a.backend, WORLD_SIZE=str(a.world), TEMP_DIR=tmp)
    if a.as_gloo:
        os.environ[GATE_VARIABLE] = "gloo"
    # The spawned processes import this file again: the environment above
    # makes them register the backend the same way (at import, see below).
    try:
        cls = suite_class()
        names = sorted(n for n in dir(cls) if n.startswith("test_"))
        if a.subset:
            subset = AS_GLOO_SUBSET if a.as_gloo else SUBSET
            missing = [n for n in subset if n not in names]
            if missing:
                sys.exit(f"torch_suite: not in this torch's suite: {missing}")
            names = subset
        elif a.k:
            names = [n for n in names if any(k in n for k in a.k)]
        elif not a.all:
            sys.exit("torch_suite: name --subset, --all or -k PATTERN")
        impl = ""
        known = {}
        if a.backend == "torchcomm":
            import torchcomm.distributed

            impl = torchcomm.distributed.implementation()
            known = KNOWN_FAILURES[impl]
            print(f"torch_suite: torchcomm backend, {impl} implementation", flush=True)
        results = run(cls, names)
        settle_known_failures(results, known)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    if a.results:
        with open(a.results, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    counts = {s: sum(1 for v in results.values() if v[0] == s) for s in ("PASS", "FAIL", "SKIP", "KNOWN")}
    for name, (status, why) in sorted(results.items()):
        if status == "KNOWN" or (status == "FAIL" and name in known):
            print(f"{status} {name}: {why}", flush=True)
    print(f"torch_suite {a.backend}{f' ({impl})' if impl else ''}, {a.world} ranks: {len(results)} tests: {counts['PASS']} passed, "
          f"{counts['FAIL']} failed, {counts['SKIP']} skipped, {counts['KNOWN']} known failures", flush=True)
    return 1 if counts["FAIL"] else 0


class _Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.status = {}

    def addSuccess(self, test):
        self.status[test._testMethodName] = ["PASS", ""]

    def addFailure(self, test, err):
        self.status[test._testMethodName] = ["FAIL", _last_line(self._exc_info_to_string(err, test))]

    addError = addFailure

    def addSkip(self, test, reason):
        self.status[test._testMethodName] = ["SKIP", reason.splitlines()[0][:200] if reason else ""]

    def addExpectedFailure(self, test, err):
        self.status[test._testMethodName] = ["PASS", "expected failure"]

    def addUnexpectedSuccess(self, test):
        self.status[test._testMethodName] = ["FAIL", "unexpected success"]


def _last_line(text):
    """The error a failure ends with (the spawned ranks' tracebacks are part
    of the parent's message): the last line naming an error, else the last."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    line = (errors or lines or [""])[-1]
    return line.split("] ", 1)[-1].strip()[:300] if "common_distributed.py" in line else line.strip()[:300]


def run(cls, names):
    results = {}
    for name in names:
        r = _Result()
        t0 = time.monotonic()
        cls(name).run(r)
        status, reason = r.status.get(name, ["FAIL", "no result"])
        results[name] = [status, reason]
        print(f"{status:4} {name} ({time.monotonic() - t0:.1f} s){': ' + reason if reason else ''}", flush=True)
    return results


def suite_class():
    if "TestDistBackendWithSpawn" not in globals():
        _define()
    return globals()["TestDistBackendWithSpawn"]


# With --as-gloo: the backend name the suite's decorators see when they
# choose which tests run (evaluated at import); the tests themselves then
# run on BACKEND.
GATE_VARIABLE = "TORCHCOMM_SUITE_GATE"


def _define():
    """The test class, at import (the spawned processes look it up by name)."""
    backend = os.environ.get("BACKEND")
    if backend is None:
        return
    gate = os.environ.get(GATE_VARIABLE)
    import torch

    if backend == "torchcomm":
        import torchcomm.distributed  # noqa: F401

        from torch.testing._internal.common_distributed import DistTestCases

        for feature in ("ddp", "subgroup", "plugin"):
            DistTestCases.backend_feature[feature].add("torchcomm")
    if gate:
        os.environ["BACKEND"] = gate
    try:
        from torch.testing._internal.distributed import distributed_test
    finally:
        os.environ["BACKEND"] = backend
    distributed_test.BACKEND = backend
    DistributedTest, TestDistBackend = distributed_test.DistributedTest, distributed_test.TestDistBackend

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    TestDistBackendWithSpawn.__qualname__ = TestDistBackendWithSpawn.__name__  # picklable by name
    globals()["TestDistBackendWithSpawn"] = TestDistBackendWithSpawn


_define()

if __name__ == "__main__":
    sys.exit(main())
