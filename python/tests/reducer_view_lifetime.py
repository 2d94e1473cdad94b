"""Views of a reducer's memory used after the reducer is freed, each in a
scenario named on the command line (run by test_grad_families.py in a
child process, on a comm of its own: one rank, a FileStore in the folder
given first). Before the views kept the memory alive, each scenario's
first write was a SIGSEGV (64 MiB buckets: the allocator unmaps them when
freed). Prints one line per scenario that held.

    python reducer_view_lifetime.py DIR numpy_free torch_with from_numpy hook_buffer released
"""
import gc
import os
import sys
import weakref

import numpy as np
import torch

import torchcomm as tc

N = 1 << 24  # float32 elements: a 64 MiB bucket


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def refuses_calls(red):
    """The freed reducer's own calls raise; only its memory lived on."""
    for call in (lambda: red.grad(0), lambda: red.mark_ready(0), red.finalize):
        try:
            call()
        except ValueError as e:
            assert "freed" in str(e), e
        else:
            raise AssertionError("a call on a freed reducer succeeded")


def numpy_free(comm):
    red = tc.Reducer(comm, [((N,), np.float32)], gradient_as_bucket_view=True)
    g = red.grad(0)
    g[:] = 2.0
    red.free()
    refuses_calls(red)
    g[:] = 1.0
    assert g.sum() == N


def torch_with(comm):
    with tc.Reducer(comm, [torch.empty(2, N // 2)], gradient_as_bucket_view=True) as red:
        t = red.grad(0)
        t.fill_(comm.rank + 1.0)
        red.mark_ready(0)
        red.finalize()  # the reducer uses the view's memory: one rank's average
    refuses_calls(red)
    row, every_other, as_numpy = t[1], t.view(-1)[::2], t.numpy()  # views of the view
    del t, red
    row.fill_(3.0)
    every_other.add_(1.0)
    assert as_numpy[1, 0] == 4.0 and as_numpy[1, 1] == 3.0 and as_numpy[0, 0] == 2.0


def from_numpy(comm):
    red = tc.Reducer(comm, [np.empty(N, np.float32)], gradient_as_bucket_view=True)
    t = torch.from_numpy(red.grad(0)).view(N // 4, 4)[1:]
    del red  # dropped without free(): the same
    gc.collect()
    t.fill_(5.0)
    assert float(t[-1, -1]) == 5.0


def hook_buffer(comm):
    kept = []

    def hook(bucket):
        kept.append(bucket.buffer)
        return bucket.comm.all_reduce(bucket.buffer, async_op=True)

    grads = [np.ones(N, np.float32)]
    with tc.Reducer(comm, grads) as red:
        red.set_hook(hook)
        red.mark_ready(0)
        red.finalize()
    kept[0][:] = 7.0
    assert kept[0][-1] == 7.0


def released(comm):
    """The view keeps neither the Reducer object nor the memory past the
    last view: the library frees it then."""
    red = tc.Reducer(comm, [((N,), np.float32)], gradient_as_bucket_view=True)
    g = red.grad(0)
    g[:] = 1.0  # every page resident
    alive = weakref.ref(red)
    red.free()
    del red
    assert alive() is None, "a view keeps the Reducer object alive"
    before = rss_bytes()
    del g
    freed = before - rss_bytes()
    assert freed > N * 4 // 2, f"RSS fell by {freed} bytes when the last view went, not the 64 MiB bucket"


def main():
    folder, scenarios = sys.argv[1], sys.argv[2:]
    store = tc.FileStore(os.path.join(folder, "store"), 1)
    comm = tc.Comm("gloo", name=f"view-lifetime-{os.getpid()}", rank=0, world_size=1, store=store, timeout=60)
    for name in scenarios:
        globals()[name](comm)
        print(f"{name}: held", flush=True)
    comm.finalize()
    comm.destroy()


if __name__ == "__main__":
    main()
