//! `tc_comm_shrink` on nccl: ncclCommShrink (NCCL 2.27+) over this comm,
//! called by the remaining ranks only (the comm layer has already checked
//! that they pass the same exclusion list). The child shares the parent's
//! device and gets its own stream, events and watchdog, like a split child.
//! A parent with a failure NCCL reported is shrunk with NCCL_SHRINK_ABORT,
//! which NCCL asks for after an error. Where the loaded NCCL has
//! ncclCommRevoke (2.28+), the failure revoked the parent's NCCL comm
//! instead of aborting it ([`NcclBackend::revoke_comm`]), so it is still
//! there to shrink; with an older NCCL the failure aborted it
//! (ncclCommAbort), as did `tc_comm_abort`, and the shrink says that
//! nothing is left to shrink and why.

use super::NcclBackend;
use crate::backends::{Backend, BackendInit};
use crate::error::{Error, Result};
use crate::nccl_loader::{self as loader, NCCL_SHRINK_ABORT, NCCL_SHRINK_DEFAULT};
use crate::util::lock;
use std::ffi::c_int;

impl NcclBackend {
    pub(super) fn shrink_backend(
        &self,
        excluded: &[i32],
        init: BackendInit,
    ) -> Result<Box<dyn Backend>> {
        let shrink = self.lib.comm_shrink.ok_or_else(|| {
            Error::unsupported(format!(
                "ncclCommShrink is missing from the loaded NCCL {} ({}): shrinking an nccl comm \
                 needs NCCL 2.27 or newer",
                self.lib.version_string(),
                self.lib.origin
            ))
        })?;
        if let Some(failure) = self.shared.failure() {
            // Revoked before this shrink holds the comm, so that the
            // watchdog's abort for the same failure finds it revoked; without
            // ncclCommRevoke that abort frees it (now or soon): refused alike.
            if !self.revoke_comm() {
                return Err(self.nothing_to_shrink(&failure));
            }
        }
        let _use = self.acquire().map_err(|e| self.nothing_to_shrink(&e))?;
        let _issuing = lock(&self.issue);
        let flags = if self.shared.failure().is_some() {
            NCCL_SHRINK_ABORT
        } else {
            NCCL_SHRINK_DEFAULT
        };
        let (want_size, want_rank) = (init.size, init.rank);
        let inherit = init.hints.is_empty();
        let mut list: Vec<c_int> = excluded.to_vec();
        let count = list.len() as c_int;
        let child = Self::build(
            self.lib,
            self.device.clone(),
            init,
            "ncclCommShrink",
            Some(self.nonblocking),
            |config, what| {
                let config: *mut loader::Config = if inherit {
                    std::ptr::null_mut()
                } else {
                    config
                };
                // SAFETY: a live comm (held by `_use`); the list and the
                // config outlive NCCL's job (split_child waits for its end).
                self.split_child(what, |c, slot| unsafe {
                    shrink(c, list.as_mut_ptr(), count, slot, config, flags)
                })
            },
        )?;
        let (size, rank) = {
            let _child_use = child.acquire()?;
            child.count_and_rank()?
        };
        if (size, rank) != (want_size, want_rank) {
            return Err(Error::internal(format!(
                "shrink of nccl comm '{}': NCCL made this rank {rank} of {size}, not \
                 {want_rank} of {want_size}",
                self.name
            )));
        }
        Ok(Box::new(child))
    }

    /// Why a shrink finds no NCCL comm (`closed`: the comm's own error).
    fn nothing_to_shrink(&self, closed: &Error) -> Error {
        let why = if self.lib.comm_revoke.is_none() {
            format!(
                "a failure aborts it (ncclCommAbort): the loaded NCCL {} \
                 ({}) has no ncclCommRevoke (NCCL 2.28+), which would have kept it for a shrink",
                self.lib.version_string(),
                self.lib.origin
            )
        } else {
            "it was aborted (tc_comm_abort), or revoking it after its failure did not succeed \
             (see the log)"
                .to_string()
        };
        Error::unsupported(format!(
            "nccl comm '{}' has no NCCL comm left to shrink: {why} ({})",
            self.name, closed.message
        ))
    }
}
