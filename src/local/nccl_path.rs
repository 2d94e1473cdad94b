//! The NCCL path: one communicator per device of the group, made once with
//! `ncclCommInitAll` and kept; every call is one NCCL group with one
//! operation per device, each on that device's stream.

use crate::cuda::RawStream;
use crate::error::{Error, Result};
use crate::nccl_loader::{self as loader, Nccl, NcclComm, NcclDataType, NcclRedOp};
use crate::types::DType;
use std::ffi::{c_int, c_void};

use super::DevCtx;

/// The group's communicators, rank i on member i's device.
pub struct Comms {
    nccl: &'static Nccl,
    comms: Vec<NcclComm>,
}

// SAFETY: NCCL comm handles may be used from any thread, one call at a time
// (the group serializes its NCCL calls).
unsafe impl Send for Comms {}
unsafe impl Sync for Comms {}

impl Comms {
    /// `ncclCommInitAll` over `ordinals` (distinct devices).
    pub fn create(ordinals: &[i32]) -> Result<Comms> {
        let nccl = loader::nccl()?;
        let init_all = nccl
            .comm_init_all
            .ok_or_else(|| Error::unsupported(format!("{} lacks ncclCommInitAll", nccl.origin)))?;
        let mut comms = vec![std::ptr::null_mut(); ordinals.len()];
        let devs: Vec<c_int> = ordinals.to_vec();
        // SAFETY: `comms` has room for one handle per device.
        let r = unsafe { init_all(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr()) };
        nccl.check(r, "ncclCommInitAll", std::ptr::null_mut())?;
        Ok(Comms { nccl, comms })
    }

    /// Runs `issue(rank, item)` for every `(rank, item)` of `seq` inside one
    /// NCCL group, each with the rank's device current; the group is always
    /// ended, and the first failure reported.
    fn group(
        &self,
        ctxs: &[DevCtx],
        seq: &[(usize, usize)],
        mut issue: impl FnMut(usize, usize) -> (c_int, &'static str),
    ) -> Result<()> {
        let n = self.nccl;
        // SAFETY: plain NCCL group brackets.
        n.check(
            unsafe { (n.group_start)() },
            "ncclGroupStart",
            std::ptr::null_mut(),
        )?;
        let mut first: Result<()> = Ok(());
        for &(r, i) in seq {
            let res = ctxs[r].dev.scoped().and_then(|_g| {
                let (rc, what) = issue(r, i);
                n.check(rc, what, self.comms[r])
            });
            if first.is_ok() {
                first = res;
            }
        }
        // SAFETY: closes the group opened above.
        let end = n.check(
            unsafe { (n.group_end)() },
            "ncclGroupEnd",
            std::ptr::null_mut(),
        );
        first.and(end)
    }

    /// Every (rank, item) pair, ranks in `ranks` order.
    fn sequence(ranks: impl Iterator<Item = usize>, items: usize) -> Vec<(usize, usize)> {
        ranks
            .flat_map(|r| (0..items).map(move |i| (r, i)))
            .collect()
    }

    /// Broadcasts of `(src, dsts per rank, bytes)` from rank `root`, one
    /// group. The root's own destination may be its source (in place).
    pub fn broadcast(
        &self,
        ctxs: &[DevCtx],
        root: usize,
        items: &[(*const c_void, Vec<*mut c_void>, usize)],
        streams: &[RawStream],
    ) -> Result<()> {
        let ranks = self.comms.len();
        // The root issues first: NCCL does not care, and the simulated
        // NCCL's one legacy stream then runs the sender before receivers.
        let order = std::iter::once(root).chain((0..ranks).filter(move |r| *r != root));
        let seq = Self::sequence(order, items.len());
        self.group(ctxs, &seq, |r, i| {
            let (src, dsts, bytes) = &items[i];
            let send = if r == root {
                *src
            } else {
                dsts[r] as *const c_void
            };
            // SAFETY: checked buffers of `bytes` bytes on rank r's device.
            let rc = unsafe {
                (self.nccl.broadcast)(
                    send,
                    dsts[r],
                    *bytes,
                    loader::NCCL_INT8,
                    root as c_int,
                    self.comms[r],
                    streams[r] as *mut c_void,
                )
            };
            (rc, "ncclBroadcast")
        })
    }

    /// Sums of `(srcs per rank, dst, count, (type, op))` into rank `root`,
    /// one group. `dst` may be the root's source (in place).
    pub fn reduce(
        &self,
        ctxs: &[DevCtx],
        root: usize,
        items: &[ReduceItem],
        streams: &[RawStream],
    ) -> Result<()> {
        let ranks = self.comms.len();
        // The root issues last (senders first, see `broadcast`).
        let order = (0..ranks)
            .filter(move |r| *r != root)
            .chain(std::iter::once(root));
        let seq = Self::sequence(order, items.len());
        self.group(ctxs, &seq, |r, i| {
            let it = &items[i];
            let recv = if r == root {
                it.dst
            } else {
                std::ptr::null_mut()
            };
            // SAFETY: checked buffers of `count` elements on rank r's device.
            let rc = unsafe {
                (self.nccl.reduce)(
                    it.srcs[r],
                    recv,
                    it.count,
                    it.types.0,
                    it.types.1,
                    root as c_int,
                    self.comms[r],
                    streams[r] as *mut c_void,
                )
            };
            (rc, "ncclReduce")
        })
    }
}

/// One sum of [`Comms::reduce`].
pub struct ReduceItem {
    pub srcs: Vec<*const c_void>,
    pub dst: *mut c_void,
    pub count: usize,
    pub types: (NcclDataType, NcclRedOp),
}

impl Drop for Comms {
    fn drop(&mut self) {
        for c in self.comms.drain(..) {
            // SAFETY: each comm destroyed once; the group is gone, so no
            // call is in flight on it.
            let _ = unsafe { (self.nccl.comm_destroy)(c) };
        }
    }
}

/// NCCL's data type and sum for `dtype` (bool: max of 0/1 bytes, i.e. or,
/// as torch adds bools); None where this NCCL lacks the type (float8 before
/// 2.24).
pub fn sum_type(dtype: DType) -> Option<(NcclDataType, NcclRedOp)> {
    let nccl = loader::nccl().ok()?;
    let t = match dtype {
        DType::F32 => loader::NCCL_FLOAT32,
        DType::F64 => loader::NCCL_FLOAT64,
        DType::F16 => loader::NCCL_FLOAT16,
        DType::BF16 => loader::NCCL_BFLOAT16,
        DType::I8 => loader::NCCL_INT8,
        DType::U8 => loader::NCCL_UINT8,
        DType::I32 => loader::NCCL_INT32,
        DType::I64 => loader::NCCL_INT64,
        DType::U32 => loader::NCCL_UINT32,
        DType::U64 => loader::NCCL_UINT64,
        DType::Bool => return Some((loader::NCCL_UINT8, loader::NCCL_MAX)),
        DType::F8E4M3 if nccl.has_fp8() => loader::NCCL_FLOAT8_E4M3,
        DType::F8E5M2 if nccl.has_fp8() => loader::NCCL_FLOAT8_E5M2,
        DType::F8E4M3 | DType::F8E5M2 => return None,
    };
    Some((t, loader::NCCL_SUM))
}
