//! Memory registration and allocation for the nccl backend
//! (`tc_comm_register`/`tc_comm_deregister`, `tc_mem_alloc`/`tc_mem_free`).
//!
//! - Registration is ncclCommRegister / ncclCommDeregister (NCCL 2.19 and
//!   later; older libraries answer `TC_ERR_UNSUPPORTED` naming the loaded
//!   version). Both are serialized with issuing (NCCL comms are not
//!   thread-safe) and hold a use of the comm, so abort cannot free it under
//!   them. Handles are remembered with a count: NCCL counts registrations
//!   by range (registering a buffer again, or a part of a registered one,
//!   returns the same handle, and each registration is deregistered once),
//!   so a handle is valid as many times as it was returned; one more is
//!   `TC_ERR_INVALID_ARGUMENT`, never passed to NCCL. Host memory is
//!   accepted by NCCL and left unregistered. After finalize or
//!   abort, deregistering only forgets the handle: NCCL released the
//!   registrations with the comm. NCCL may hand out a NULL handle (it
//!   registered nothing, e.g. NCCL_LOCAL_REGISTER=0); deregistering NULL is
//!   a no-op at the C layer.
//! - Allocation is ncclMemAlloc / ncclMemFree (memory NCCL can use with
//!   NVLink SHARP and zero-copy paths). A library without them (NCCL 2.18)
//!   falls back to cuMemAlloc on the comm's device: plain device memory,
//!   which every NCCL operation accepts. Pointers are remembered with the
//!   allocator that made them; freeing works after finalize or abort, and
//!   what is still allocated when the comm is destroyed is freed then, with
//!   a warning.

use super::loader::NcclComm;
use super::{lock, NcclBackend};
use crate::cuda;
use crate::error::{Error, Result};
use std::ffi::c_void;

/// Which allocator made a pointer of `tc_mem_alloc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Allocator {
    Nccl,
    Driver,
}

impl NcclBackend {
    pub(super) fn register_memory(&self, buf: *mut c_void, bytes: usize) -> Result<*mut c_void> {
        let register = self.lib.comm_register.ok_or_else(|| {
            Error::unsupported(format!(
                "memory registration needs ncclCommRegister (NCCL 2.19 or newer); the loaded NCCL is {} ({})",
                self.lib.version_string(),
                self.lib.origin
            ))
        })?;
        let _serial = lock(&self.issue);
        let _use = self.acquire()?;
        let _ctx = self.device.scoped()?;
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: the comm is held by `_use`; the caller keeps `buf` valid
        // for `bytes` until it deregisters; valid out-pointer.
        self.call("ncclCommRegister", |c: NcclComm| unsafe {
            register(c, buf, bytes, &mut handle)
        })?;
        if !handle.is_null() {
            *lock(&self.registrations)
                .entry(handle as usize)
                .or_insert(0) += 1;
        }
        Ok(handle)
    }

    pub(super) fn deregister_memory(&self, handle: *mut c_void) -> Result<()> {
        if !self.forget_registration(handle) {
            return Err(Error::invalid_argument(format!(
                "argument 'handle': {handle:p} is not a registration of nccl comm '{}' (never returned by tc_comm_register, or deregistered already)",
                self.name
            )));
        }
        let _serial = lock(&self.issue);
        let Ok(_use) = self.acquire() else {
            // Finalized or aborted: NCCL released every registration with
            // the comm.
            return Ok(());
        };
        let deregister = self.lib.comm_deregister.ok_or_else(|| {
            Error::internal("the loaded NCCL has ncclCommRegister but not ncclCommDeregister")
        })?;
        let _ctx = self.device.scoped()?;
        // SAFETY: a handle this comm's ncclCommRegister returned, released
        // once per registration (counted down above); the comm is held by
        // `_use`.
        self.call("ncclCommDeregister", |c: NcclComm| unsafe {
            deregister(c, handle)
        })
    }

    /// Drops one registration of `handle`; false when it has none left.
    fn forget_registration(&self, handle: *mut c_void) -> bool {
        let mut regs = lock(&self.registrations);
        let Some(count) = regs.get_mut(&(handle as usize)) else {
            return false;
        };
        *count -= 1;
        if *count == 0 {
            regs.remove(&(handle as usize));
        }
        true
    }

    pub(super) fn alloc_memory(&self, bytes: usize) -> Result<*mut c_void> {
        let _use = self.acquire()?;
        let _ctx = self.device.scoped()?;
        let (ptr, kind) = match self.lib.mem_alloc {
            Some(alloc) => {
                let mut p: *mut c_void = std::ptr::null_mut();
                // SAFETY: valid out-pointer; the device's context is current
                // (ncclMemAlloc allocates on the current device).
                let r = unsafe { alloc(&mut p, bytes) };
                self.lib.check(
                    r,
                    &format!("ncclMemAlloc({bytes} bytes)"),
                    std::ptr::null_mut(),
                )?;
                (p, Allocator::Nccl)
            }
            None => {
                crate::log_info!(
                    "nccl comm '{}': NCCL {} lacks ncclMemAlloc; tc_mem_alloc uses cuMemAlloc",
                    self.name,
                    self.lib.version_string()
                );
                (cuda::device_alloc(bytes)?, Allocator::Driver)
            }
        };
        lock(&self.allocations).insert(ptr as usize, kind);
        Ok(ptr)
    }

    pub(super) fn free_memory(&self, ptr: *mut c_void) -> Result<()> {
        let kind = lock(&self.allocations).remove(&(ptr as usize)).ok_or_else(|| {
            Error::invalid_argument(format!(
                "argument 'ptr': {ptr:p} was not allocated by tc_mem_alloc on nccl comm '{}' (or was freed already)",
                self.name
            ))
        })?;
        self.release_allocation(ptr, kind)
    }

    fn release_allocation(&self, ptr: *mut c_void, kind: Allocator) -> Result<()> {
        let _ctx = self.device.scoped()?;
        match (kind, self.lib.mem_free) {
            // SAFETY: a pointer ncclMemAlloc returned, freed once (it was
            // removed from the table by the caller).
            (Allocator::Nccl, Some(free)) => {
                self.lib
                    .check(unsafe { free(ptr) }, "ncclMemFree", std::ptr::null_mut())
            }
            (Allocator::Nccl, None) => Err(Error::internal(
                "the loaded NCCL has ncclMemAlloc but not ncclMemFree",
            )),
            (Allocator::Driver, _) => cuda::device_free(ptr),
        }
    }

    /// Frees what `tc_mem_free` was never called for (the comm is being
    /// destroyed; nothing can free it later).
    pub(super) fn free_leftovers(&self) {
        let left: Vec<(usize, Allocator)> = lock(&self.allocations).drain().collect();
        if left.is_empty() {
            return;
        }
        crate::log_warn!(
            "nccl comm '{}' destroyed with {} buffer(s) from tc_mem_alloc not freed; freeing them now",
            self.name,
            left.len()
        );
        for (p, kind) in left {
            if let Err(e) = self.release_allocation(p as *mut c_void, kind) {
                crate::log_warn!("{}", e.message);
            }
        }
    }
}
