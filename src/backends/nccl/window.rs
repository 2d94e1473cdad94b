//! Windows (one-sided RMA) on the nccl backend, through NCCL's host-side
//! one-sided API (NCCL 2.29+): `ncclCommWindowRegister` (collective
//! registration), `ncclPutSignal` (a put that raises one signal at its
//! target), `ncclWaitSignal` (waits for a count of signals from a peer),
//! all stream-ordered. The loader resolves them as optional symbols; a
//! library without them (older than 2.29) makes `tc_window_new` answer
//! `TC_ERR_UNSUPPORTED` naming its version, its origin and what it lacks.
//!
//! How the window's calls map onto NCCL (see [`super::window_rma`]):
//!
//! - register (collective): the user's buffer and a control buffer of our
//!   own are registered as symmetric windows (`NCCL_WIN_COLL_SYMMETRIC`);
//!   one all-gather then gives every rank the others' buffer sizes (so a
//!   put is bounds-checked at the origin with a named error) and how many
//!   signals each rank has sent each other one on this comm so far.
//! - put: one `ncclPutSignal` into the target's buffer at the offset. NCCL
//!   2.29 only puts from memory inside a symmetric window of the origin, so
//!   a source outside this rank's registered buffer is copied through a
//!   staging part of the control buffer (in pieces of 1 MiB).
//! - signal: NCCL raises a signal with every put, and a bare `ncclSignal`
//!   could not be told apart from a put's at the target. So a signal is a
//!   put of one 8-byte record into the target's control buffer (a ring of
//!   256 slots per origin, `window_rma::RING`) saying which of the origin's
//!   operations it is; `wait_signal` waits for NCCL's signals one
//!   operation at a time until the record of its next signal is there,
//!   then for the rest up to that operation. A signal therefore follows every earlier put.
//! - get: NCCL has no get. `tc_window_get` from this rank's own buffer is
//!   a local copy; from another rank it is `TC_ERR_UNSUPPORTED` (the owner
//!   would have to take part; have the owner put instead, or use gloo).
//! - calls are synchronous on the host: each runs on a stream of the
//!   window (one for puts and signals, one for waits) and returns when the
//!   stream finished it (polled, so a timeout, a free or the comm's abort
//!   ends it). They are not ordered with the caller's streams:
//!   synchronize work that writes a put's source first.
//! - operations to this rank itself are local copies and a local count.
//!
//! NCCL counts signals per comm, not per window: one window of an nccl
//! comm may have a registered buffer at a time (another is refused with
//! `TC_ERR_INVALID_USAGE` naming why), and counts left over by a window
//! (puts nobody waited for) are consumed by the next window's first wait
//! for that peer.

use super::loader::{version_code, version_string, Nccl};
use super::window_rma::NcclWindow;
use super::NcclBackend;
use crate::backends::WindowBackend;
use crate::error::{Error, Result};

/// The first NCCL version whose header declares the host RMA calls.
const RMA_VERSION: i32 = version_code(2, 29, 0);

/// The host RMA entry points the loaded library lacks.
fn missing_rma(lib: &Nccl) -> Vec<&'static str> {
    [
        ("ncclCommWindowRegister", lib.comm_window_register.is_some()),
        (
            "ncclCommWindowDeregister",
            lib.comm_window_deregister.is_some(),
        ),
        ("ncclPutSignal", lib.put_signal.is_some()),
        ("ncclSignal", lib.signal.is_some()),
        ("ncclWaitSignal", lib.wait_signal.is_some()),
    ]
    .into_iter()
    .filter(|(_, present)| !present)
    .map(|(name, _)| name)
    .collect()
}

/// `TC_ERR_UNSUPPORTED` unless the loaded NCCL has the host RMA API.
fn check_rma(lib: &Nccl, label: &str) -> Result<()> {
    let missing = missing_rma(lib);
    if missing.is_empty() && lib.version >= RMA_VERSION {
        return Ok(());
    }
    let what = if missing.is_empty() {
        String::new()
    } else {
        format!(" (it lacks {})", missing.join(", "))
    };
    Err(Error::unsupported(format!(
        "{label}: windows on the nccl backend need NCCL {} or newer (its host RMA API: \
         ncclCommWindowRegister, ncclPutSignal, ncclSignal, ncclWaitSignal); the loaded NCCL is {} from {}{what}; \
         use a gloo comm for windows",
        version_string(RMA_VERSION),
        lib.version_string(),
        lib.origin
    )))
}

/// `tc_window_new` on an nccl comm (see the module's doc).
pub(super) fn create(backend: &NcclBackend) -> Result<Box<dyn WindowBackend>> {
    check_rma(backend.lib, &backend.label)?;
    Ok(Box::new(NcclWindow::new(backend)?))
}
