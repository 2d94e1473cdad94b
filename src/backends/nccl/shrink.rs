//! `tc_comm_shrink` on nccl: ncclCommShrink (NCCL 2.27+) over this comm,
//! called by the remaining ranks only (the comm layer has already checked
//! that they pass the same exclusion list). The child shares the parent's
//! device and gets its own stream, events and watchdog, like a split child.
//! A parent with a failure NCCL reported (but not yet aborted) is shrunk
//! with NCCL_SHRINK_ABORT, which first ends its operations; a parent the
//! comm already aborted (ncclCommAbort after a failure was found) has no
//! NCCL comm left to shrink, and the shrink says so.

use super::*;

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
        let _use = self.acquire().map_err(|e| {
            Error::unsupported(format!(
                "nccl comm '{}' has no NCCL comm left to shrink: it was aborted (ncclCommAbort) \
                 when its failure was found ({}); on nccl, shrink a comm before it is aborted \
                 (with TORCHCOMM_ABORT_ON_ERROR=0 a failure still aborts it)",
                self.name, e.message
            ))
        })?;
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
}
