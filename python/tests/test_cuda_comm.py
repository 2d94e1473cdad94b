"""torchcomm.cuda_comm against torch.cuda.comm without a GPU: the same
signatures, and for every call torch refuses before touching a device (bad
argument combinations, CPU tensors where CUDA ones are required, bad dims,
empty lists, CUDA needed on a machine without it) the same exception type
and message. The CUDA path is compared with torch in the GPU suite
(capi_tests/gpu/test_cuda_comm.py). Needs no comm: each rank of the job
runs it alone."""
import inspect
import warnings

import pytest
import torch
import torch.cuda.comm as torch_comm

import torchcomm.cuda_comm as ours

T = torch.arange(6.0)
NAMES = ["broadcast", "broadcast_coalesced", "scatter", "gather", "reduce_add", "reduce_add_coalesced"]

# Calls torch refuses on this machine (no CUDA tensor can be made here).
CASES = {
    "broadcast: neither devices nor out": lambda c: c.broadcast(T),
    "broadcast: devices and out": lambda c: c.broadcast(T, [0], out=[T]),
    "broadcast: CPU tensor to device 0": lambda c: c.broadcast(T, [0]),
    "broadcast: 'cpu' in devices": lambda c: c.broadcast(T, ["cpu"]),
    "broadcast: device -1": lambda c: c.broadcast(T, [-1]),
    "broadcast: CPU out": lambda c: c.broadcast(T, out=[torch.empty(6)]),
    "broadcast: empty out": lambda c: c.broadcast(T, out=[]),
    "broadcast: no devices": lambda c: c.broadcast(T, []),
    "broadcast_coalesced: CPU tensors": lambda c: c.broadcast_coalesced([T], [0]),
    "broadcast_coalesced: 'cpu' device": lambda c: c.broadcast_coalesced([T], ["cpu"]),
    "scatter: devices None": lambda c: c.scatter(T),
    "scatter: CPU tensor to device 0": lambda c: c.scatter(T, [0]),
    "scatter: out and devices": lambda c: c.scatter(T, [0], out=[T]),
    "scatter: out and chunk_sizes": lambda c: c.scatter(T, chunk_sizes=[6], out=[T]),
    "scatter: CPU out": lambda c: c.scatter(T, out=[torch.empty(6)]),
    "scatter: empty out": lambda c: c.scatter(T, out=[]),
    "scatter: no devices": lambda c: c.scatter(T, []),
    "scatter: chunk_sizes of another length": lambda c: c.scatter(T, [0, 1], chunk_sizes=[1]),
    "scatter: dim out of range": lambda c: c.scatter(T, [0], dim=1),
    "scatter: dim out of range, 2-D": lambda c: c.scatter(torch.ones(2, 3), [0], dim=-3),
    "gather: CPU tensor": lambda c: c.gather([T]),
    "gather: destination 'cpu'": lambda c: c.gather([T], destination="cpu"),
    "gather: out and destination": lambda c: c.gather([T], destination=0, out=T),
    "gather: CPU tensor into out": lambda c: c.gather([T], out=torch.empty(6)),
    "gather: no tensors": lambda c: c.gather([], destination="cpu"),
    "gather: dim out of range": lambda c: c.gather([T], dim=2, destination="cpu"),
    "reduce_add: CPU inputs": lambda c: c.reduce_add([T, T], 0),
    "reduce_add: destination None": lambda c: c.reduce_add([T, T]),
    "reduce_add: no inputs": lambda c: c.reduce_add([], 0),
    "reduce_add_coalesced: CPU inputs": lambda c: c.reduce_add_coalesced([[T], [T]], 0),
    "reduce_add_coalesced: lists of different lengths": lambda c: c.reduce_add_coalesced([[T], [T, T]], 0),
    "reduce_add_coalesced: empty lists": lambda c: c.reduce_add_coalesced([[], []], 0),
}


def outcome(module, call):
    """(exception type name, message) or ("returned", repr of the result)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "returned", repr(call(module))
        except Exception as e:  # noqa: BLE001 - comparing what each raises
            return type(e).__name__, str(e).split("\n")[0]


@pytest.mark.parametrize("name", NAMES)
def test_signature_is_torchs(name):
    theirs = inspect.signature(getattr(torch_comm, name)).parameters
    mine = inspect.signature(getattr(ours, name)).parameters
    assert [(p.name, p.kind, p.default) for p in mine.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]


def test_all_is_torchs():
    assert sorted(ours.__all__) == sorted(torch_comm.__all__)


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_as_torch_refuses(case):
    want = outcome(torch_comm, CASES[case])
    got = outcome(ours, CASES[case])
    assert got == want


def test_gather_destination_minus_one_warns_as_torch():
    for module in (torch_comm, ours):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(RuntimeError, match="Expected all input tensors to be CUDA tensors"):
                module.gather([T], destination=-1)
        assert [w.category for w in seen] == [FutureWarning], module.__name__
        assert "Using -1 to represent CPU tensor is deprecated" in str(seen[0].message)


@pytest.mark.parametrize("bad", [-1, 1.5, "10"])
def test_buffer_size_must_be_a_non_negative_int(bad):
    # Checked before any device is touched (torch refuses these in its C++ binding).
    with pytest.raises(TypeError, match="buffer_size"):
        ours.broadcast_coalesced([], [0], buffer_size=bad)


def test_broadcast_coalesced_without_devices_raises():
    # torch reads devices[0] of the empty list (undefined behaviour in its C++).
    with pytest.raises(RuntimeError, match="Expected at least one device to broadcast to"):
        ours.broadcast_coalesced([T], [])


# The library calls behind the CUDA path, on groups whose members are all
# the CPU (tc_local_* accepts those without a GPU): pointers, byte counts,
# offsets, staging of non-contiguous or other-dtype outputs, moved dims.


def test_broadcast_calls_on_cpu_members():
    src = torch.arange(12.0).reshape(4, 3)
    outs = [torch.empty(4, 3), torch.empty(3, 4).t(), torch.empty(4, 3, dtype=torch.int64), src]
    assert ours._broadcast_out_impl(src, outs) is outs
    for o in outs:
        assert torch.equal(o, src.to(o.dtype))
    nc = torch.arange(24.0).reshape(4, 6)[:, ::2]  # a non-contiguous source
    out = torch.empty(4, 3)
    ours._broadcast_out_impl(nc, [out])
    assert torch.equal(out, nc)


@pytest.mark.parametrize("bucket", [1, 64, 10485760])
def test_broadcast_coalesced_calls_on_cpu_members(bucket):
    srcs = [torch.arange(100, dtype=torch.float32), torch.arange(21, dtype=torch.int64).reshape(7, 3),
            torch.arange(33, dtype=torch.float16), torch.zeros(0), torch.arange(9, dtype=torch.float64)]
    rows = [[torch.full(s.shape, -1, dtype=s.dtype) for s in srcs] for _ in range(3)]
    ours._lib_broadcast_coalesced(srcs, rows, bucket)
    for row in rows:
        for s, t in zip(srcs, row):
            assert torch.equal(s, t)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("copied", [[0, 1, 2, 3], [0, 2, 3], [1, 3], [2]])
def test_scatter_copies_on_cpu_members(dim, copied):
    # chunks left out of `copied` split the others into separate runs (separate calls)
    src = torch.arange(7 * 6 * 2, dtype=torch.float32).reshape(7, 6, 2)
    wrapped = ours._wrap_dim(dim, src)
    sizes = {0: [2, 1, 3, 1], 1: [1, 2, 3, 0], 2: [1, 1, 0, 0]}[wrapped]  # empty chunks too
    chunks = list(src.split_with_sizes(sizes, wrapped))
    want = [c.clone() for c in chunks]
    outs = {i: torch.full(c.shape, -1.0, dtype=torch.float64 if i == 2 else torch.float32) for i, c in enumerate(chunks)}
    outs[3] = torch.full(tuple(reversed(chunks[3].shape)), -1.0).permute(*reversed(range(src.dim())))  # non-contiguous
    ours._copy_chunks(src, wrapped, chunks, [(i, ours._CPU, None, outs[i]) for i in copied])
    for i, c in enumerate(chunks):
        if i in copied:
            assert c is outs[i] and torch.equal(c, want[i].to(c.dtype)), i
        else:
            assert torch.equal(c, want[i]), i
            assert c.untyped_storage().data_ptr() == src.untyped_storage().data_ptr(), i  # still a view of src


@pytest.mark.parametrize("dim", [0, 1])
def test_gather_calls_on_cpu_members(dim):
    parts = [torch.arange(6.0).reshape(2, 3), torch.arange(6.0, 15.0).reshape(3, 3), torch.zeros(0, 3)]
    if dim == 1:
        parts = [p.t() for p in parts]
    want = torch.cat(parts, dim)
    for out in (torch.empty(want.shape), torch.empty(want.shape, dtype=torch.float64),
                torch.empty(tuple(reversed(want.shape))).t()):
        assert ours._gather_out_impl(parts, out, dim) is out
        assert torch.equal(out, want.to(out.dtype))


def test_buckets_as_torchs_cpp_take_tensors():
    # per type, in order; a bucket closes once it holds the limit (the tensor that reaches it included)
    ts = [torch.zeros(100), torch.zeros(21, dtype=torch.int64), torch.zeros(33, dtype=torch.float16),
          torch.zeros(100), torch.zeros(2), torch.zeros(3, dtype=torch.int64)]
    assert ours._cpp_buckets(ts, 400) == [[0], [3], [1, 5], [2], [4]]
    assert ours._cpp_buckets(ts, 0) == [[0], [1], [2], [3], [4], [5]]
    assert ours._cpp_buckets(ts, 10485760) == [[0, 3, 4], [1, 5], [2]]


def test_source_device_row_aliases_as_torch():
    # devices[0] listed again: a lone contiguous tensor's bucket is the tensor's own memory,
    # a bucket of several is one new buffer; every result a new tensor object
    ts = [torch.arange(100.0), torch.arange(21, dtype=torch.int64), torch.arange(4.0), torch.arange(6.0).reshape(2, 3).t()]
    row = ours._source_device_row(ts, 400)  # buckets [0], [1], [2, 3]
    for t, r in zip(ts, row):
        assert r is not t and torch.equal(r, t) and r.shape == t.shape
    storage = [r.untyped_storage().data_ptr() for r in row]
    assert storage[0] == ts[0].untyped_storage().data_ptr() and storage[1] == ts[1].untyped_storage().data_ptr()
    assert storage[2] == storage[3] != ts[2].untyped_storage().data_ptr()


class _Placed:
    """What the NCCL dtype refusal reads of a tensor, for a CUDA tensor that
    cannot be made here."""

    def __init__(self, dtype, device, contiguous=True, cuda=True):
        self.dtype, self.device, self.contiguous, self.is_cuda = dtype, device, contiguous, cuda
        self.is_sparse = False

    def get_device(self):
        return self.device

    def is_contiguous(self):
        return self.contiguous


def test_broadcast_refuses_what_torchs_nccl_path_refuses():
    """torch hands dense contiguous CUDA tensors on distinct devices (the
    source alone, too) to NCCL, whose type table has no int16: it raises
    there (seen on a GPU), and copies every other list."""
    with pytest.raises(RuntimeError, match="Unconvertible NCCL type Short"):
        ours._refuse_as_torch_nccl([_Placed(torch.int16, 0)])
    with pytest.raises(RuntimeError, match="Unconvertible NCCL type Short"):
        ours._refuse_as_torch_nccl([_Placed(torch.int16, 0), _Placed(torch.int16, 1)])
    copied = [
        [_Placed(torch.float32, 0)],  # a dtype NCCL has
        [_Placed(torch.int16, 0), _Placed(torch.int16, 0)],  # a device twice
        [_Placed(torch.int16, 0, contiguous=False)],
        [_Placed(torch.int16, -1, cuda=False)],  # the CPU
    ]
    for tensors in copied:
        ours._refuse_as_torch_nccl(tensors)
