//! The C handle of a store (`tc_store_t`), defined below the C boundary:
//! `ffi::store` makes and uses it, and the comm options
//! (`tc_comm_options_t::store`) name it.

#![allow(non_camel_case_types)]

use super::StoreRef;

/// A key-value store handle. Thread-safe: one handle may be used from several
/// threads at once. Comms created with it keep their own reference, so it
/// may be freed while they live.
pub struct tc_store {
    pub(crate) inner: StoreRef,
    /// Port of the TCP store (server or client), 0 for other stores.
    pub(crate) port: u16,
}

pub type tc_store_t = tc_store;

impl tc_store {
    pub(crate) fn new(inner: StoreRef) -> tc_store {
        tc_store { inner, port: 0 }
    }
}
