//! GPU backend over NCCL. Not implemented yet: creating it answers
//! `TC_ERR_UNSUPPORTED` (listed in the README).

use super::{Backend, BackendInit};
use crate::error::{Error, Result};

pub fn create(_init: BackendInit) -> Result<Box<dyn Backend>> {
    Err(Error::unsupported(
        "the nccl backend is not implemented in this version of libtorchcomm; use \"gloo\" for host memory",
    ))
}
