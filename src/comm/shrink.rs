//! Shrinking a comm (`tc_comm_shrink`): the ranks that remain after
//! excluding some (typically dead ones) make a new comm, in their old
//! order, without the excluded ranks taking part.
//!
//! The parent may be healthy or aborted (a peer died mid-operation). The
//! survivors first agree on the exclusion list through the comm's store:
//! each publishes its sorted list and compares it with every other
//! survivor's, so that a survivor passing a different list gets
//! `TC_ERR_INVALID_USAGE` naming the rank that differs instead of a hang.
//! Then the new comm is made: on backends that split natively (NCCL,
//! through `ncclCommShrink`) from the parent's backend, otherwise (gloo) by
//! a fresh rendezvous of the survivors in the store.
//!
//! Store keys live under `<parent name>/<size>.<incarnation>/shrink.<k>/<new
//! name>`: `k` counts this comm's shrinks into that name (every survivor
//! makes them alike, like any collective; a rank excluded from one does not
//! count it), so two shrinks, or a shrink and a split (under `<parent
//! name>/split`), never meet each other's keys. The
//! store must outlive the failure: when a rank hosts it (rank 0 under the
//! `MASTER_ADDR` bootstrap) and dies, the shrink fails with the store's
//! error, told so.

use super::{Comm, CommOptions};
use crate::backends::{self, BackendInit};
use crate::error::{Error, ErrorKind, Result};
use crate::store::prefix::PrefixStore;
use crate::store::StoreRef;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// What a comm keeps for its shrinks.
pub(super) struct ShrinkState {
    /// The comm's own store scope, `<name>/<size>.<incarnation>`.
    scope: String,
    /// Shrinks of this comm begun so far (past argument checks), by new
    /// name: an excluded rank does not count a shrink it took no part in.
    made: Mutex<HashMap<String, u64>>,
}

impl ShrinkState {
    pub(super) fn new(scope: String) -> ShrinkState {
        ShrinkState {
            scope,
            made: Mutex::new(HashMap::new()),
        }
    }
}

impl Comm {
    /// Collective over the ranks not in `exclude` (parent ranks): they make
    /// a new comm named `name`, ranked in their old order. Works on an
    /// active or aborted comm, not on a finalized one. `opts.timeout` and
    /// `opts.abort_on_error` default to the parent's; `opts.name` is not
    /// used.
    pub fn shrink(&self, exclude: &[i32], name: &str, opts: CommOptions) -> Result<Arc<Comm>> {
        if matches!(*crate::util::lock(&self.state), super::State::Finalized) {
            return Err(Error::invalid_usage(format!(
                "comm '{}' was finalized: shrink it before tc_comm_finalize",
                self.name
            )));
        }
        super::check_comm_name(name)?;
        let excluded = self.checked_exclusions(exclude)?;
        let survivors: Vec<i32> = (0..self.size).filter(|r| !excluded.contains(r)).collect();
        let new_rank = survivors
            .iter()
            .position(|r| *r == self.rank)
            .expect("checked: this rank is not excluded") as i32;
        let timeout = opts.timeout.unwrap_or(self.timeout());
        let k = {
            let mut made = crate::util::lock(&self.shrink.made);
            let count = made.entry(name.to_string()).or_insert(0);
            *count += 1;
            *count - 1
        };
        let scope = format!("{}/shrink.{k}/{name}", self.shrink.scope);
        let what = format!(
            "shrinking comm '{}' into '{name}' (rank {} excluding {excluded:?})",
            self.name, self.rank
        );
        agree_on_exclusions(
            &self.base_store,
            &scope,
            self.rank,
            &excluded,
            &survivors,
            timeout,
        )
        .map_err(|e| store_hint(e).context(&what))?;
        // Survivor groups that exclude each other never share keys.
        let child_store: StoreRef = Arc::new(PrefixStore::new(
            &format!("{scope}/{}", list_text(&survivors).replace(',', "-")),
            self.base_store.clone(),
        ));
        let child_opts = CommOptions {
            timeout: Some(timeout),
            abort_on_error: opts
                .abort_on_error
                .or(Some(self.abort_on_error.load(Ordering::Relaxed))),
            ..opts
        };
        let native = self.backend.splits_natively();
        Comm::with_store(
            &self.backend_name,
            self.device,
            name.to_string(),
            new_rank,
            survivors.len() as i32,
            self.local_rank,
            child_store,
            timeout,
            &child_opts,
            Some(self.child_root_ranks(&survivors)),
            |init: BackendInit| {
                if native {
                    self.backend.shrink(&excluded, init)
                } else {
                    backends::create(&self.backend_name, init)
                }
            },
        )
        .map_err(|e| store_hint(e).context(&what))
    }

    /// `exclude` sorted, after checking that every rank is in range, none
    /// repeats, this rank is not among them and someone remains.
    fn checked_exclusions(&self, exclude: &[i32]) -> Result<Vec<i32>> {
        let mut sorted = Vec::with_capacity(exclude.len());
        for (i, r) in exclude.iter().enumerate() {
            if *r < 0 || *r >= self.size {
                return Err(Error::invalid_argument(format!(
                    "argument 'exclude_ranks[{i}]': rank {r} is outside [0, {})",
                    self.size
                )));
            }
            if sorted.contains(r) {
                return Err(Error::invalid_argument(format!(
                    "argument 'exclude_ranks[{i}]': rank {r} appears twice"
                )));
            }
            if *r == self.rank {
                return Err(Error::invalid_usage(format!(
                    "argument 'exclude_ranks[{i}]': this rank ({r}) is excluded; only the \
                     ranks that remain call tc_comm_shrink"
                )));
            }
            sorted.push(*r);
        }
        sorted.sort_unstable();
        Ok(sorted)
    }
}

/// "1,3": a rank list as published in the store.
fn list_text(ranks: &[i32]) -> String {
    ranks
        .iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Publishes this rank's exclusion list under `scope` and checks that every
/// other survivor published the same one, within `timeout`.
fn agree_on_exclusions(
    store: &StoreRef,
    scope: &str,
    me: i32,
    excluded: &[i32],
    survivors: &[i32],
    timeout: std::time::Duration,
) -> Result<()> {
    let mine = list_text(excluded);
    let peers: Vec<String> = survivors.iter().map(i32::to_string).collect();
    let agreement = super::agreement::Agreement {
        store,
        scope: &format!("{scope}/excluded"),
        timeout,
    };
    agreement.agree(
        &me.to_string(),
        &mine,
        peers.iter().map(String::as_str),
        |r, why| {
            Error::timeout(format!(
                "rank {r} did not call shrink within {} ms (a rank that died or does \
                 not take part must be in exclude_ranks): {why}",
                timeout.as_millis(),
            ))
        },
        |r, theirs| {
            let excludes_me = theirs.split(',').any(|t| t == me.to_string());
            Error::invalid_usage(format!(
                "rank {r} passed exclude_ranks [{theirs}], this rank passed [{mine}]{}: \
                 every remaining rank must pass the same ranks (in any order)",
                if excludes_me {
                    format!(" (rank {r} excludes this rank)")
                } else {
                    String::new()
                }
            ))
        },
    )
}

/// Says, of a failure to reach the store, that the store must survive.
fn store_hint(e: Error) -> Error {
    if matches!(e.kind, ErrorKind::Remote | ErrorKind::System) && e.message.contains("store") {
        return e.context(
            "the comm's store is unreachable (it must outlive the excluded ranks: when a rank \
             hosts it, as rank 0 does under the MASTER_ADDR bootstrap, that rank cannot be \
             excluded)",
        );
    }
    e
}
