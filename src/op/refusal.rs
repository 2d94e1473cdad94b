//! A collective refused on this rank, issued in its place ([`Refusal`]).

/// A collective call refused on this rank (a bad argument, a failed local
/// check), issued in place of the call so that every rank fails it: a
/// backend takes part in the synchronisation its peers make for their
/// call, tells them this rank's `reason`, and fails. Without it the
/// refusing rank would skip a collective its peers run, and every later
/// collective would pair with the wrong call (silent wrong data).
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The refused call's name, as the C API spells it (`tc_all_reduce`).
    pub call: &'static str,
    /// The refusing rank.
    pub rank: i32,
    /// Why: the error this rank's caller gets.
    pub error: crate::error::Error,
}

impl Refusal {
    /// What the other ranks are told: "rank 1 refused this call
    /// (tc_broadcast_coalesced): argument 'dtypes[0]' ...".
    pub fn told(&self) -> String {
        format!(
            "rank {} refused this call ({}): {}",
            self.rank, self.call, self.error.message
        )
    }
}
