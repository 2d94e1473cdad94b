//! Windows (one-sided RMA) on the nccl backend.
//!
//! NCCL 2.29 added a host-side one-sided API: `ncclCommWindowRegister`
//! (collective registration of a buffer), `ncclPutSignal` (a put that
//! raises a signal at the target), `ncclSignal` and `ncclWaitSignal`, all
//! stream-ordered. The loader resolves them as optional symbols. This
//! module decides what `tc_window_new` answers for the loaded library:
//!
//! - a library without them (older than 2.29, or built without them):
//!   `TC_ERR_UNSUPPORTED` naming its version, where it came from, and the
//!   missing entry points;
//! - a library with them: `TC_ERR_UNSUPPORTED` as well, saying so: mapping
//!   `tc_window_put` (no signal), `tc_window_get` (no NCCL counterpart) and
//!   signal counting onto them is not implemented yet, and a window must
//!   not pretend to work where nothing has verified it.

use super::loader::{version_code, version_string, Nccl};
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

/// `tc_window_new` on an nccl comm (see the module's doc).
pub(super) fn create(lib: &Nccl, label: &str) -> Result<Box<dyn WindowBackend>> {
    let missing = missing_rma(lib);
    if !missing.is_empty() || lib.version < RMA_VERSION {
        let what = if missing.is_empty() {
            String::new()
        } else {
            format!(" (it lacks {})", missing.join(", "))
        };
        return Err(Error::unsupported(format!(
            "{label}: windows on the nccl backend need NCCL {} or newer (its host RMA API: \
             ncclCommWindowRegister, ncclPutSignal, ncclSignal, ncclWaitSignal); the loaded NCCL is {} from {}{what}; \
             use a gloo comm for windows",
            version_string(RMA_VERSION),
            lib.version_string(),
            lib.origin
        )));
    }
    Err(Error::unsupported(format!(
        "{label}: the loaded NCCL {} ({}) has the host RMA API, but windows on the nccl backend \
         are not implemented by libtorchcomm yet; use a gloo comm for windows",
        lib.version_string(),
        lib.origin
    )))
}
