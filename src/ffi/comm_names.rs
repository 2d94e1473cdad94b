//! The names of this process's live comms, which must be unique: a comm
//! handle holds a [`NameLease`] from creation to `tc_comm_destroy`, and a
//! second live comm (made by `tc_comm_new` or `tc_comm_split`) cannot take
//! the same name.

use crate::error::{Error, Result};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

static LIVE_NAMES: Mutex<Option<HashSet<String>>> = Mutex::new(None);
static GENERATED: AtomicU64 = AtomicU64::new(0);

/// A comm name reserved for one live comm; dropping it frees the name.
pub struct NameLease(String);

impl NameLease {
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl Drop for NameLease {
    fn drop(&mut self) {
        let mut names = LIVE_NAMES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(names) = names.as_mut() {
            names.remove(&self.0);
        }
    }
}

fn try_lease(name: &str) -> Option<NameLease> {
    let mut names = LIVE_NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    names
        .get_or_insert_with(HashSet::new)
        .insert(name.to_string())
        .then(|| NameLease(name.to_string()))
}

/// Reserves `name` (argument `arg`) for a new comm, or refuses it with
/// `TC_ERR_INVALID_ARGUMENT` when a live comm of this process has it.
pub fn lease(name: &str, arg: &str) -> Result<NameLease> {
    try_lease(name).ok_or_else(|| {
        Error::invalid_argument(format!(
            "argument '{arg}': a live comm of this process is already named {name:?}; \
             names must be unique among live comms (destroy that comm first)"
        ))
    })
}

/// Reserves a generated name, `comm<N>`, for a comm created without one:
/// the first of the sequence that no live comm has. Processes that create
/// their unnamed comms in the same order get the same names.
pub fn lease_generated() -> NameLease {
    loop {
        let n = GENERATED.fetch_add(1, Ordering::Relaxed);
        if let Some(lease) = try_lease(&format!("comm{n}")) {
            return lease;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_free_again_once_its_lease_is_dropped() {
        let first = lease("names-unit-test", "opts.name").unwrap();
        let e = lease("names-unit-test", "opts.name").err().unwrap();
        assert!(
            e.message.contains("opts.name") && e.message.contains("\"names-unit-test\""),
            "{}",
            e.message
        );
        drop(first);
        assert_eq!(
            lease("names-unit-test", "name").unwrap().name(),
            "names-unit-test"
        );
    }
}
