"""torchcomm.cuda_comm against torch.cuda.comm on real GPUs.

Every function is called with the same inputs through both modules, and the
results compared: their Python structure (list, tuple, list of lists),
each tensor's device, dtype, shape, layout and values, and which results
are the input tensors themselves or views of them (torch returns the input
for its own device). Calls torch refuses must be refused by ours with the
same exception type. Works on one GPU (device lists such as [0], [0, 0] and
the CPU: the copies paths) and uses every visible GPU when there are more
(distinct devices: the NCCL paths). Run from the gathered suite:
    PYTHONPATH=gpu-suite/python TORCHCOMM_LIBRARY=gpu-suite/lib/libtorchcomm.so \
        python3 gpu-suite/tests/test_cuda_comm.py
Prints one line per failed check, then "N passed, M failed".
"""
import sys
import traceback

import torch
import torch.cuda.comm as theirs

import torchcomm.cuda_comm as ours

passed = failed = 0
N = torch.cuda.device_count()
ALL = list(range(N))
CUDA0 = torch.device("cuda", 0)


def values(shape, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        t = torch.randint(0, 2, shape, generator=g).bool()
    elif dtype.is_complex:
        t = torch.complex(torch.randint(0, 8, shape, generator=g).float(), torch.randint(0, 8, shape, generator=g).float()).to(dtype)
    else:
        t = torch.randint(0, 8, shape, generator=g).to(dtype)
    return t.to(device)


def describe(x, inputs):
    """A comparable description of a result."""
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [describe(y, inputs) for y in x])
    if isinstance(x, torch.Tensor):
        same = [i for i, t in enumerate(inputs) if x is t]
        view = [i for i, t in enumerate(inputs) if not x.is_sparse and not t.is_sparse and x.numel() and t.numel()
                and x.device == t.device and x.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()]
        dense = x.to_dense() if x.is_sparse else x
        return ("tensor", str(x.device), x.dtype, tuple(x.shape), x.layout, same, view, dense.cpu())
    return ("other", repr(x))


def equal(a, b):
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def same_as_torch(name, call, inputs=()):
    """Runs call(theirs) and call(ours) and compares what they give."""
    global passed, failed
    got = {}
    for label, module in (("torch", theirs), ("torchcomm", ours)):
        try:
            result = call(module)
            torch.cuda.synchronize()
            got[label] = describe(result, list(inputs))
        except Exception as e:  # noqa: BLE001 - compared below
            got[label] = ("raised", type(e).__name__)
            if label == "torchcomm" and got["torch"][0] != "raised":
                traceback.print_exc()
    if equal(got["torch"], got["torchcomm"]):
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}:\n  torch:     {got['torch']}\n  torchcomm: {got['torchcomm']}", file=sys.stderr)


def device_lists():
    lists = [[0], [0, 0]]
    if N > 1:
        lists += [ALL, ALL[::-1], [1, 0, 1]]
    return lists


def torch_nccl_refuses(dtype, devices):
    """torch's NCCL path (distinct devices) has no NCCL type for int16 and
    complex numbers and raises where our library moves bytes or sums pairs
    of reals: those calls are compared on the copies path only."""
    distinct = len(devices) > 1 and len(set(devices)) == len(devices)
    return distinct and (dtype == torch.int16 or dtype.is_complex)


def test_broadcast():
    for dtype in (torch.float32, torch.float16, torch.int64, torch.bool, torch.complex64, torch.int16):
        host = values((5, 3), dtype)
        dev = host.to(CUDA0)
        for devices in device_lists():
            if torch_nccl_refuses(dtype, devices):
                continue
            same_as_torch(f"broadcast CPU {dtype} to {devices}", lambda m: m.broadcast(host, devices), [host])
            same_as_torch(f"broadcast cuda:0 {dtype} to {devices}", lambda m: m.broadcast(dev, devices), [dev])
        if torch_nccl_refuses(dtype, [0] + ALL):
            continue
        outs = lambda: [torch.empty(5, 3, dtype=dtype, device=CUDA0)] + [torch.empty(3, 5, dtype=dtype, device=d).t() for d in ALL]
        same_as_torch(f"broadcast {dtype} out= (one non-contiguous per device)", lambda m: m.broadcast(dev, out=outs()), [dev])
    src = values((4,), torch.float32, CUDA0)
    same_as_torch("broadcast out= of another dtype", lambda m: m.broadcast(src, out=[torch.empty(4, dtype=torch.float64, device=CUDA0)]), [src])
    same_as_torch("broadcast out= with the source itself", lambda m: m.broadcast(src, out=[src]), [src])
    same_as_torch("broadcast out= of another shape", lambda m: m.broadcast(src, out=[torch.empty(5, device=CUDA0)]), [src])
    nc = values((6, 4), torch.float32, CUDA0)[:, 1:3]
    same_as_torch("broadcast a non-contiguous source", lambda m: m.broadcast(nc, [0, 0] + ALL), [nc])
    empty = torch.empty(0, 3, device=CUDA0)
    same_as_torch("broadcast an empty tensor", lambda m: m.broadcast(empty, [0] + ALL), [empty])
    sp = values((4, 5), torch.float32).to_sparse().to(CUDA0)
    same_as_torch("broadcast a sparse tensor", lambda m: m.broadcast(sp, [0] + ALL), [sp])


def test_broadcast_coalesced():
    ts = [values((100,), torch.float32, CUDA0, 1), values((7, 3), torch.int64, CUDA0, 2),
          values((33,), torch.float16, CUDA0, 3), values((2, 2), torch.complex64, CUDA0, 4),
          values((10,), torch.float32, CUDA0, 5), values((3, 4), torch.float32, CUDA0, 6).to_sparse()]
    for devices in device_lists():
        for size in (10485760, 64, 1, 0):
            same_as_torch(f"broadcast_coalesced to {devices}, buffer_size {size}",
                          lambda m: m.broadcast_coalesced(ts, devices, size), ts)
    same_as_torch("broadcast_coalesced of no tensors", lambda m: m.broadcast_coalesced([], [0] + ALL), [])
    host = [values((3,), torch.float32)]
    same_as_torch("broadcast_coalesced of CPU tensors", lambda m: m.broadcast_coalesced(host, [0]), host)


def test_scatter():
    for src_dev in ("cpu", CUDA0):
        t = values((7, 5, 2), torch.float32, src_dev)
        for devices in device_lists() + [[0, 0, 0, 0, 0, 0, 0, 0, 0]]:
            for dim in (0, 1, -1):
                same_as_torch(f"scatter {src_dev} to {devices} dim {dim}", lambda m: m.scatter(t, devices, dim=dim), [t])
            sizes = [7 - (len(devices) - 1)] + [1] * (len(devices) - 1)
            same_as_torch(f"scatter {src_dev} to {devices} chunk_sizes {sizes}",
                          lambda m: m.scatter(t, devices, chunk_sizes=sizes), [t])
        same_as_torch(f"scatter {src_dev}, chunk_sizes not summing up", lambda m: m.scatter(t, [0, 0], chunk_sizes=[1, 1]), [t])
        streams = [torch.cuda.Stream(d) for d in [0] + ALL]
        same_as_torch(f"scatter {src_dev} with streams", lambda m: m.scatter(t, [0] + ALL, streams=streams), [t])
        if N > 1:
            same_as_torch(f"scatter {src_dev} with a stream of another device",
                          lambda m: m.scatter(t, [0, 0], streams=[None, torch.cuda.Stream(1)]), [t])
        outs = lambda: [torch.empty(3, 5, 2, device=CUDA0), torch.empty(2, 5, 2, dtype=torch.float64, device=CUDA0),
                        torch.empty(5, 2, 2, device=ALL[-1]).transpose(0, 1)]
        same_as_torch(f"scatter {src_dev} out= (other dtype, non-contiguous)", lambda m: m.scatter(t, out=outs()), [t])
        outs1 = lambda: [torch.empty(7, 2, 2, device=CUDA0), torch.empty(7, 3, 2, device=ALL[-1])]
        same_as_torch(f"scatter {src_dev} out= along dim 1", lambda m: m.scatter(t, dim=1, out=outs1()), [t])
        bad = lambda: [torch.empty(3, 5, 2, device=CUDA0)]
        same_as_torch(f"scatter {src_dev} out= not summing up", lambda m: m.scatter(t, out=bad()), [t])


def test_gather():
    parts = [values((2, 3), torch.float32, d, i) for i, d in enumerate([0] + ALL + [0])]
    for dim in (0, 1, -1):
        for dest in (None, 0, ALL[-1], "cpu", -1, torch.device("cpu"), CUDA0):
            same_as_torch(f"gather dim {dim} to {dest}", lambda m: m.gather(parts, dim, dest), parts)
    for out in (lambda: torch.empty(len(parts) * 2, 3), lambda: torch.empty(len(parts) * 2, 3, device=CUDA0),
                lambda: torch.empty(3, len(parts) * 2, dtype=torch.float64, device=ALL[-1]).t()):
        same_as_torch("gather out=", lambda m: m.gather(parts, out=out()), parts)
    same_as_torch("gather out= of a wrong shape", lambda m: m.gather(parts, out=torch.empty(3, 3)), parts)
    mixed = [values((2, 3), torch.float32, CUDA0), values((2, 4), torch.float32, CUDA0)]
    same_as_torch("gather shapes differing outside dim", lambda m: m.gather(mixed, 0, 0), mixed)
    same_as_torch("gather shapes differing at dim", lambda m: m.gather(mixed, 1, "cpu"), mixed)
    cl = [values((2, 3, 4, 5), torch.float32, d).to(memory_format=torch.channels_last) for d in [0] + ALL]
    same_as_torch("gather channels_last", lambda m: m.gather(cl, 0, 0).stride(), cl)
    same_as_torch("gather complex", lambda m: m.gather([values((3,), torch.complex64, d) for d in [0] + ALL], 0, 0))


def test_reduce_add():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.complex64):
        for devices in device_lists():
            if torch_nccl_refuses(dtype, devices):
                continue
            ins = [values((9, 4), dtype, d, i) for i, d in enumerate(devices)]
            for dest in (None, 0, devices[-1]):
                same_as_torch(f"reduce_add {dtype} on {devices} to {dest}", lambda m: m.reduce_add(ins, dest), ins)
    ins = [values((3,), torch.float32, 0), values((4,), torch.float32, 0)]
    same_as_torch("reduce_add of different sizes", lambda m: m.reduce_add(ins, 0), ins)
    if N > 1:
        ins = [values((3,), torch.float32, 1), values((3,), torch.float32, 1)]
        same_as_torch("reduce_add to a device without an input", lambda m: m.reduce_add(ins, 0), ins)
    sp = [values((4, 5), torch.float32, "cpu", i).to_sparse().to(d) for i, d in enumerate([0] + ALL)]
    same_as_torch("reduce_add of sparse tensors", lambda m: m.reduce_add(sp, 0), sp)


def test_reduce_add_coalesced():
    for devices in device_lists():
        rows = [[values((50,), torch.float32, d, 10 * k), values((3, 7), torch.int64, d, 10 * k + 1),
                 values((5,), torch.float16, d, 10 * k + 2), values((2, 2), torch.float32, "cpu", 10 * k + 3).to_sparse().to(d),
                 values((8,), torch.float32, d, 10 * k + 4)] for k, d in enumerate(devices)]
        flat = [t for r in rows for t in r]
        for size in (10485760, 48, 0):
            for dest in (None, devices[-1]):
                same_as_torch(f"reduce_add_coalesced on {devices} to {dest}, buffer_size {size}",
                              lambda m: m.reduce_add_coalesced(rows, dest, size), flat)
    rows = [[values((3,), torch.float32, 0)], [values((4,), torch.float32, 0)]]
    same_as_torch("reduce_add_coalesced of different sizes", lambda m: m.reduce_add_coalesced(rows, 0), rows[0] + rows[1])


def main():
    global failed
    print(f"test_cuda_comm: torch {torch.__version__}, {N} GPU(s)")
    for test in (test_broadcast, test_broadcast_coalesced, test_scatter, test_gather, test_reduce_add,
                 test_reduce_add_coalesced):
        before = (passed, failed)
        try:
            test()
        except Exception:  # noqa: BLE001 - a crash of the harness itself counts as a failure
            traceback.print_exc()
            failed += 1
        print(f"{'ok  ' if failed == before[1] else 'FAIL'}: {test.__name__} ({passed - before[0]} passed)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
