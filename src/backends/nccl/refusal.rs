//! Refusals on nccl (see [`crate::op::Refusal`]). A peer cannot be told
//! inside NCCL, so a refused collective fails only the refusing rank, which
//! publishes its reason in the comm's store; a peer whose operation then
//! times out names the refusing rank and the argument.

use crate::error::Result;
use crate::store::StoreRef;
use std::sync::mpsc;
use std::time::Duration;

/// How long a timed-out operation waits for the store's answer.
const LOOKUP: Duration = Duration::from_millis(500);

fn key(rank: i32) -> String {
    format!("refusal/{rank}")
}

/// The comm's refusals in its store (scoped by the comm's name).
pub struct Refusals {
    store: StoreRef,
    rank: i32,
    size: i32,
}

impl Refusals {
    pub fn new(store: StoreRef, rank: i32, size: i32) -> Refusals {
        Refusals { store, rank, size }
    }

    /// Publishes this rank's latest refusal, what its peers are told.
    pub fn publish(&self, told: &str) -> Result<()> {
        self.store.set(&key(self.rank), told.as_bytes())
    }

    /// The refusals the other ranks published ("rank 1 refused this call
    /// ..."), None if none or the store did not answer within [`LOOKUP`]
    /// (asked on a thread and connection of its own, so that a stopped
    /// store host costs no more).
    pub fn by_peers(&self) -> Option<String> {
        let (store, me, n) = (self.store.clone(), self.rank, self.size);
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("tc-nccl-refusals".into())
            .spawn(move || {
                let store = store.clone_store().unwrap_or(store);
                let told: Vec<String> = (0..n)
                    .filter(|r| *r != me && store.check(&[&key(*r)]).unwrap_or(false))
                    .filter_map(|r| store.get(&key(r)).ok())
                    .map(|v| String::from_utf8_lossy(&v).into_owned())
                    .collect();
                let _ = tx.send(told);
            })
            .ok()?;
        let told = rx.recv_timeout(LOOKUP).ok()?;
        (!told.is_empty()).then(|| told.join("; "))
    }
}
