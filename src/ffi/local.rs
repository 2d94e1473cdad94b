//! `tc_local_*`: one process driving several devices (torch.cuda.comm's
//! broadcast, broadcast_coalesced, scatter, gather, reduce_add and
//! reduce_add_coalesced) over a device group, with no ranks and no store.
//!
//! The conventions every operation shares are documented on [`tc_local`]
//! (they go into the header there).

use crate::cuda::RawStream;
use crate::error::{tc_result_t, Error, Result};
use crate::ffi::handle::{Handle, HandleType};
use crate::ffi::{
    arg_out, arg_slice, boundary, boundary_void, handle_ref, into_handle, take_handle,
};
use crate::local::{LocalGroup, Place, Settings, Streams, DEFAULT_BUCKET_BYTES};
use crate::options::{read_versioned, Versioned, TC_UNSET};
use crate::types::{tc_device_t, tc_dtype_t, DType, TC_DEVICE_CPU, TC_DEVICE_CUDA};
use std::ffi::c_void;
use std::mem::size_of;

pub const TC_LOCAL_OPTIONS_MAGIC: u32 = 0x5443_4C4F;
pub const TC_LOCAL_OPTIONS_VERSION: u32 = 1;

/// Options of `tc_local_new`. Initialize with `TC_LOCAL_OPTIONS_INIT`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_local_options_t {
    /// `sizeof(tc_local_options_t)` as the caller compiled it.
    pub size: usize,
    /// Must be `TC_LOCAL_OPTIONS_MAGIC`.
    pub magic: u32,
    /// `TC_LOCAL_OPTIONS_VERSION` as the caller compiled it.
    pub version: u32,
    /// 0: never use NCCL (always the copies path). `TC_UNSET` or 1: NCCL
    /// where it applies and loads.
    pub use_nccl: i32,
    /// Bucket size in bytes of the coalesced forms when a call passes 0;
    /// 0: 10 MiB (torch's default).
    pub bucket_bytes: usize,
}

impl Versioned for tc_local_options_t {
    const MAGIC: u32 = TC_LOCAL_OPTIONS_MAGIC;
    const NAME: &'static str = "tc_local_options_t";
    fn defaults() -> Self {
        tc_local_options_t {
            size: size_of::<Self>(),
            magic: TC_LOCAL_OPTIONS_MAGIC,
            version: TC_LOCAL_OPTIONS_VERSION,
            use_nccl: TC_UNSET,
            bucket_bytes: 0,
        }
    }
}

/// A device group: CUDA devices (and, where a function allows it, the CPU)
/// driven by this one process, with its NCCL communicators once made.
///
/// Conventions of the `tc_local_*` operations:
/// - `g` is a group from `tc_local_new`; member i is `devices[i]`.
/// - `streams`: NULL (every device's legacy default stream) or an array of
///   one `CUstream`/`cudaStream_t` per member (entries of CPU members are
///   ignored; a NULL entry is that device's legacy stream); each stream must
///   belong to its member's device.
/// - Stream ordering: work on device buffers is enqueued on the members'
///   streams, after the work already enqueued on them, and the call returns
///   without waiting for the device, as torch's functions do; copies
///   between devices are ordered with the streams of both devices by
///   events. Where a destination is host memory the call returns once the
///   data is there (torch's copies to the CPU are blocking too); pageable
///   host sources are read during the call, pinned ones when the stream
///   reaches the copy (keep them unchanged until then).
/// - Errors (`TC_ERR_NULL_ARGUMENT`, `TC_ERR_INVALID_ARGUMENT` naming the
///   argument: an index out of range, a buffer on another device than its
///   member's, checked with `cuPointerGetAttribute`, overlapping
///   destinations, overflowing counts) are found before anything is
///   enqueued: nothing is written. NULL buffers are accepted only where
///   they hold 0 bytes.
/// - Which path ran (NCCL or copies) is logged at `TORCHCOMM_DEBUG=INFO`.
/// - Thread-safe: calls on one group may come from several threads; NCCL
///   path calls are serialized.
pub struct tc_local {
    inner: LocalGroup,
}

impl Handle for tc_local {
    const TYPE: HandleType = HandleType::Local;
}

pub type tc_local_t = tc_local;

fn place_of(d: &tc_device_t, arg: &str) -> Result<Place> {
    match d.r#type {
        TC_DEVICE_CPU => Ok(Place::Cpu),
        TC_DEVICE_CUDA => Ok(Place::Cuda(d.index)),
        t => Err(Error::invalid_argument(format!(
            "argument '{arg}': unknown device type {t} (TC_DEVICE_CPU or TC_DEVICE_CUDA)"
        ))),
    }
}

/// The group, the per-member streams and the pointer array of `n` entries.
unsafe fn streams_arg<'a>(g: &LocalGroup, streams: *const *mut c_void) -> Streams<'a> {
    Streams(
        (!streams.is_null())
            .then(|| std::slice::from_raw_parts(streams as *const RawStream, g.size())),
    )
}

/// Like `arg_slice`, but NULL is an error even for 0 entries.
unsafe fn list<'a, T>(p: *const T, n: usize, name: &str) -> Result<&'a [T]> {
    if p.is_null() {
        return Err(Error::null_argument(name));
    }
    arg_slice(p, n, name)
}

fn dtypes_of(raw: &[tc_dtype_t]) -> Result<Vec<DType>> {
    raw.iter()
        .enumerate()
        .map(|(i, d)| DType::from_c(*d, &format!("dtypes[{i}]")))
        .collect()
}

/// Creates a group over `devices[0..n]` (`TC_DEVICE_CUDA` with an explicit
/// index — -1 is refused — or `TC_DEVICE_CPU`; a device may appear more
/// than once, which makes the group use the copies path). Retains each CUDA
/// device's primary context; NCCL communicators are made on the first call
/// that can use them (`ncclCommInitAll`) and kept until `tc_local_free`.
/// `opts` may be NULL and is copied. On success `*out` receives the group.
/// Errors: `TC_ERR_NULL_ARGUMENT` (`devices`, `out`), `TC_ERR_INVALID_ARGUMENT`
/// (`n` = 0, a device type or index out of range, a bad options magic),
/// `TC_ERR_UNAVAILABLE` for a CUDA device without a CUDA driver. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_local_new(
    devices: *const tc_device_t,
    n: usize,
    opts: *const tc_local_options_t,
    out: *mut *mut tc_local_t,
) -> tc_result_t {
    boundary("tc_local_new", || {
        let out = unsafe { arg_out(out, "out")? };
        let devices = unsafe { list(devices, n, "devices")? };
        let o = unsafe { read_versioned(opts, "opts")? };
        let places = devices
            .iter()
            .enumerate()
            .map(|(i, d)| place_of(d, &format!("devices[{i}]")))
            .collect::<Result<Vec<_>>>()?;
        let settings = Settings {
            use_nccl: o.use_nccl != 0,
            bucket_bytes: if o.bucket_bytes == 0 {
                DEFAULT_BUCKET_BYTES
            } else {
                o.bucket_bytes
            },
        };
        *out = into_handle(tc_local {
            inner: LocalGroup::new(places, settings)?,
        });
        Ok(())
    })
}

/// Destroys a group: waits for the library's own staging buffers to be
/// released by the devices, destroys its NCCL communicators and releases
/// the devices' contexts. NULL is a no-op. Work already enqueued completes;
/// no call on the group may be running or follow.
#[no_mangle]
pub extern "C" fn tc_local_free(g: *mut tc_local_t) {
    boundary_void("tc_local_free", || {
        drop(unsafe { take_handle(g, "g")? });
        Ok(())
    })
}

/// Copies `count` elements of `dt` at `src`, which lives on member
/// `src_index`, into `dsts[i]` on member i for every member (torch.cuda.comm
/// broadcast). `dsts[src_index]` may be `src` itself (nothing copied there).
/// NCCL path (one `ncclBroadcast` per device in one group) when every member
/// is a distinct CUDA device; copies otherwise (a CPU member or a repeated
/// device). Stream-ordered on `streams` (see `tc_local`; a CPU
/// destination or source makes the call host-synchronous for that copy).
#[no_mangle]
pub extern "C" fn tc_local_broadcast(
    g: *mut tc_local_t,
    src: *const c_void,
    src_index: usize,
    dsts: *const *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    streams: *const *mut c_void,
) -> tc_result_t {
    boundary("tc_local_broadcast", || {
        let g = &unsafe { handle_ref(g, "g")? }.inner;
        let dsts = unsafe { list(dsts, g.size(), "dsts")? };
        let dtype = DType::from_c(dt, "dt")?;
        g.broadcast(src, src_index, dsts, count, dtype, unsafe {
            streams_arg(g, streams)
        })
    })
}

/// Broadcasts `n` buffers at once (torch.cuda.comm broadcast_coalesced):
/// buffer t is `counts[t]` elements of `dtypes[t]` at `srcs[t]` on member 0,
/// copied to `dsts[d * n + t]` on member d (row-major, one row per member;
/// row 0 may repeat `srcs`). Buffers are bucketed by data type up to
/// `buffer_bytes` (0: the group's bucket size, 10 MiB by default); on the
/// NCCL path each bucket is one NCCL group. Stream-ordered on `streams`.
#[no_mangle]
pub extern "C" fn tc_local_broadcast_coalesced(
    g: *mut tc_local_t,
    srcs: *const *const c_void,
    counts: *const usize,
    dtypes: *const tc_dtype_t,
    n: usize,
    buffer_bytes: usize,
    dsts: *const *mut c_void,
    streams: *const *mut c_void,
) -> tc_result_t {
    boundary("tc_local_broadcast_coalesced", || {
        let g = &unsafe { handle_ref(g, "g")? }.inner;
        let (srcs, counts, raw) = unsafe {
            (
                arg_slice(srcs, n, "srcs")?,
                arg_slice(counts, n, "counts")?,
                arg_slice(dtypes, n, "dtypes")?,
            )
        };
        let total = n
            .checked_mul(g.size())
            .ok_or_else(|| Error::invalid_argument("argument 'n': too large"))?;
        let dsts = unsafe { arg_slice(dsts, total, "dsts")? };
        let dtypes = dtypes_of(raw)?;
        g.broadcast_coalesced(srcs, counts, &dtypes, buffer_bytes, dsts, unsafe {
            streams_arg(g, streams)
        })
    })
}

/// Splits `count` elements of `dt` at `src` (on `src_device`: the CPU or
/// any CUDA device, in the group or not) along dimension 0 into `dsts[i]` on
/// member i (torch.cuda.comm scatter). The buffer is flat and contiguous; to
/// split a row-major tensor along dimension 0 give counts in elements of
/// whole rows (rows x row length). `chunk_counts`: `n_members` element
/// counts summing to `count`, or NULL for torch.chunk's rule: chunks of
/// ceil(count / n_members) elements, the last one shorter; when fewer chunks
/// are needed than there are members, the remaining members get nothing
/// (their `dsts` entries are not written and may be NULL), e.g. 5 elements
/// over 4 devices are 2, 2, 1, 0. Always the copies path, stream-ordered on
/// the destinations' `streams` (and, for a device source, on the stream of
/// its first member on that device, else its legacy stream).
#[no_mangle]
pub extern "C" fn tc_local_scatter(
    g: *mut tc_local_t,
    src: *const c_void,
    src_device: tc_device_t,
    count: usize,
    dt: tc_dtype_t,
    chunk_counts: *const usize,
    dsts: *const *mut c_void,
    streams: *const *mut c_void,
) -> tc_result_t {
    boundary("tc_local_scatter", || {
        let g = &unsafe { handle_ref(g, "g")? }.inner;
        let dsts = unsafe { list(dsts, g.size(), "dsts")? };
        let dtype = DType::from_c(dt, "dt")?;
        let place = place_of(&src_device, "src_device")?;
        let chunks = (!chunk_counts.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(chunk_counts, g.size()) });
        g.scatter(src, place, count, dtype, chunks, dsts, unsafe {
            streams_arg(g, streams)
        })
    })
}

/// Concatenates `srcs[i]` (`counts[i]` elements of `dt` on member i) in
/// member order into `dst` on `dst_device`: the CPU (torch's
/// `destination=-1`; the call returns once the data is there) or any CUDA
/// device, in the group or not (stream-ordered on `stream`, a stream of that
/// device, NULL: its legacy stream). Sources are read in order with their
/// device's legacy stream (with `stream` for sources on the destination's
/// device): order work on other streams before the call. Always the copies
/// path.
#[no_mangle]
pub extern "C" fn tc_local_gather(
    g: *mut tc_local_t,
    srcs: *const *const c_void,
    counts: *const usize,
    dt: tc_dtype_t,
    dst: *mut c_void,
    dst_device: tc_device_t,
    stream: *mut c_void,
) -> tc_result_t {
    boundary("tc_local_gather", || {
        let g = &unsafe { handle_ref(g, "g")? }.inner;
        let (srcs, counts) = unsafe {
            (
                list(srcs, g.size(), "srcs")?,
                list(counts, g.size(), "counts")?,
            )
        };
        let dtype = DType::from_c(dt, "dt")?;
        let place = place_of(&dst_device, "dst_device")?;
        g.gather(srcs, counts, dtype, dst, place, stream as RawStream)
    })
}

/// Writes into `dst`, on member `dst_index`, the elementwise sum of
/// `srcs[i]` (`count` elements of `dt` on member i) over every member
/// (torch.cuda.comm reduce_add). Every member must be a CUDA device; `dst`
/// may be `srcs[dst_index]` (in place). NCCL path (`ncclReduce` to that root
/// in one group) when the members are distinct devices; otherwise copies
/// into pinned host staging on the destination's stream, summed there by a
/// host function in member order and copied to `dst` (float8 is then
/// `TC_ERR_UNSUPPORTED`). bool sums are logical or. Stream-ordered on
/// `streams`; host-asynchronous on both paths.
#[no_mangle]
pub extern "C" fn tc_local_reduce_add(
    g: *mut tc_local_t,
    srcs: *const *const c_void,
    count: usize,
    dt: tc_dtype_t,
    dst: *mut c_void,
    dst_index: usize,
    streams: *const *mut c_void,
) -> tc_result_t {
    boundary("tc_local_reduce_add", || {
        let g = &unsafe { handle_ref(g, "g")? }.inner;
        let srcs = unsafe { list(srcs, g.size(), "srcs")? };
        let dtype = DType::from_c(dt, "dt")?;
        g.reduce_add(srcs, count, dtype, dst, dst_index, unsafe {
            streams_arg(g, streams)
        })
    })
}

/// Sums `n` buffers at once (torch.cuda.comm reduce_add_coalesced): buffer
/// t is `counts[t]` elements of `dtypes[t]` at `srcs[d * n + t]` on member d
/// (row-major, one row per member), summed into `dsts[t]` on member
/// `dst_index` (which may be the source of that member). Bucketed by data
/// type up to `buffer_bytes` (0: the group's bucket size, 10 MiB by
/// default); otherwise as `tc_local_reduce_add`.
#[no_mangle]
pub extern "C" fn tc_local_reduce_add_coalesced(
    g: *mut tc_local_t,
    srcs: *const *const c_void,
    counts: *const usize,
    dtypes: *const tc_dtype_t,
    n: usize,
    buffer_bytes: usize,
    dsts: *const *mut c_void,
    dst_index: usize,
    streams: *const *mut c_void,
) -> tc_result_t {
    boundary("tc_local_reduce_add_coalesced", || {
        let g = &unsafe { handle_ref(g, "g")? }.inner;
        let total = n
            .checked_mul(g.size())
            .ok_or_else(|| Error::invalid_argument("argument 'n': too large"))?;
        let (srcs, counts, raw, dsts) = unsafe {
            (
                arg_slice(srcs, total, "srcs")?,
                arg_slice(counts, n, "counts")?,
                arg_slice(dtypes, n, "dtypes")?,
                arg_slice(dsts, n, "dsts")?,
            )
        };
        let dtypes = dtypes_of(raw)?;
        g.reduce_add_coalesced(
            srcs,
            counts,
            &dtypes,
            buffer_bytes,
            dsts,
            dst_index,
            unsafe { streams_arg(g, streams) },
        )
    })
}
