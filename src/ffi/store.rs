//! `tc_store_*`: rendezvous stores.

use crate::store::StoreRef;

/// A key-value store handle. Thread-safe: one handle may be used from several
/// threads at once. Comms created with it keep their own reference, so it
/// may be freed while they live.
pub struct tc_store {
    pub(crate) inner: StoreRef,
}

#[allow(non_camel_case_types)]
pub type tc_store_t = tc_store;
