//! Persistent all-gather (`tc_all_gather_p_*`): the output buffer, count and
//! dtype are fixed once, by a collective set-up that validates them and has
//! every rank agree on them; each execution then only checks its input and
//! issues the prepared operation, skipping the per-call validation and
//! backend checks of `tc_all_gather_single` and, without a CUDA driver, the
//! per-call look for device buffers to stage.

use super::Comm;
use crate::backends::BufferHome;
use crate::error::{Error, Result};
use crate::op::{Op, OpOptions, Ptr};
use crate::types::DType;
use crate::work::Work;
use std::ffi::c_void;
use std::sync::Arc;

/// A prepared all-gather of `count` elements per rank into `output`
/// (`count * size` elements, rank r's at `r * count`).
pub struct PersistentAllGather {
    comm: Arc<Comm>,
    output: Ptr,
    count: usize,
    dtype: DType,
    /// Whether a CUDA driver is loaded: without one no buffer can be device
    /// memory, and executions skip the look for buffers to stage.
    cuda: bool,
}

impl PersistentAllGather {
    /// Validates the output for `count` elements per rank; on a host
    /// backend (gloo), collectively, has every rank agree on (count, dtype)
    /// with one all-gather, failing on every rank, naming a rank that
    /// differs, when they do not (on a device backend, nccl, the set-up is
    /// local).
    pub fn new(comm: Arc<Comm>, output: Ptr, count: usize, dtype: DType) -> Result<Self> {
        comm.check_active()?;
        if output.is_null() && count > 0 {
            return Err(Error::null_argument("output"));
        }
        // The in-place input stands in for the executions' own (memory of
        // the output's kind, which the nccl backend checks).
        let block = dtype.bytes(count, "count")?;
        let stand_in =
            Ptr(output.as_u8().wrapping_add(comm.rank() as usize * block) as *mut c_void);
        let probe = Op::all_gather_single(output, stand_in, count, dtype);
        probe.validate(comm.rank(), comm.size())?;
        comm.backend().abilities().check(&probe)?;
        // Host buffers only on a host backend; on a device backend, as for
        // the plain call, the ranks' counts must agree without a check.
        if comm.backend().buffer_home() == BufferHome::Host {
            agree(&comm, count, dtype)?;
        }
        Ok(PersistentAllGather {
            comm,
            output,
            count,
            dtype,
            cuda: crate::cuda::is_available(),
        })
    }

    pub fn comm(&self) -> &Arc<Comm> {
        &self.comm
    }

    /// Gathers `count` elements at `input` from every rank into the output.
    pub fn exec(&self, input: Ptr, opts: &OpOptions) -> Result<Arc<dyn Work>> {
        if self.count > 0 && input.is_null() {
            return Err(Error::null_argument("input"));
        }
        self.comm.check_active()?;
        let op = Op::all_gather_single(self.output, input, self.count, self.dtype);
        // A device backend (nccl) checks every call's input pointer (device
        // memory of the comm's device): the plain call there.
        if self.comm.backend().buffer_home() != BufferHome::Host {
            return self.comm.submit(op, opts);
        }
        self.comm.submit_checked(op, opts, self.cuda)
    }
}

/// Every rank's (count, dtype) through one all-gather; an error names the
/// first rank whose pair differs from this rank's.
fn agree(comm: &Comm, count: usize, dtype: DType) -> Result<()> {
    let n = comm.size() as usize;
    let mut mine = [count as u64, dtype.to_c() as u64];
    let mut all = vec![0u64; 2 * n];
    let op = Op::all_gather_single(
        Ptr(all.as_mut_ptr() as *mut c_void),
        Ptr(mine.as_mut_ptr() as *mut c_void),
        2,
        DType::U64,
    );
    comm.submit(op, &OpOptions::default())?;
    match all.chunks(2).position(|p| p != mine) {
        None => Ok(()),
        Some(r) => Err(Error::invalid_usage(format!(
            "all_gather_p_init: rank {r} set up count {} of dtype {}, this rank count {count} \
             of dtype {}; every rank must pass the same count and dtype",
            all[2 * r],
            DType::ALL
                .get(all[2 * r + 1] as usize)
                .map_or("?", |d| d.name()),
            dtype.name()
        ))),
    }
}
