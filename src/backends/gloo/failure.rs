//! Failure reports through the comm's store: after a rank's first
//! timeout or lost peer, the diagnosis that names the rank at fault; and
//! the refusals told through the store by the transports that carry none
//! in their own messages.

use super::signature::{describe_sig, signature_words};
use crate::backends::BackendInit;
use crate::error::{Error, ErrorKind, Result};
use crate::op::{Op, Refusal};
use crate::store::{Store, StoreRef};
use crate::util::{lock, Deadline};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// The first failure that left a comm, or a transport's connections,
/// unusable: every later call fails with it.
#[derive(Default)]
pub(super) struct Unusable(Mutex<Option<Error>>);

impl Unusable {
    /// Records `why` unless a failure came first: whether it was the first.
    pub(super) fn record(&self, why: &Error) -> bool {
        let mut first = lock(&self.0);
        let was_none = first.is_none();
        first.get_or_insert_with(|| why.clone());
        was_none
    }

    pub(super) fn is_set(&self) -> bool {
        lock(&self.0).is_some()
    }

    /// Adds `text` to the recorded failure's message (a diagnosis).
    pub(super) fn append(&self, text: &str) {
        if let Some(e) = lock(&self.0).as_mut() {
            e.message.push_str(text);
        }
    }

    /// Ok until a failure was recorded; then that failure, as the error of
    /// a later call on the gloo context of comm `name`.
    pub(super) fn check(&self, name: &str) -> Result<()> {
        match &*lock(&self.0) {
            None => Ok(()),
            Some(e) => Err(Error::new(
                e.kind,
                format!(
                    "gloo context of comm '{name}' is unusable after an earlier failure: {}",
                    e.message
                ),
            )),
        }
    }
}

/// How long a rank whose operation timed out or lost a peer waits for the
/// other ranks' failure reports (see [`FailureReports::diagnose`]).
/// Together with the thread start and store round trips it stays within
/// the watchdog grace the gloo backend asks for (`HostBackend::watchdog_grace`),
/// so the diagnosis is part of the first error message.
pub(super) const DIAGNOSIS_WINDOW: Duration = Duration::from_millis(400);

/// A comm's failure reports: its store, and what the reports count.
pub(super) struct FailureReports {
    store: StoreRef,
    rank: usize,
    size: usize,
    /// Operations run so far: the report of a failure names its number.
    ops_run: AtomicU64,
    /// Set by the first failure that was diagnosed.
    diagnosed: AtomicBool,
    /// Refusals told so far (see [`FailureReports::refuse`]).
    refusals: AtomicU64,
}

impl FailureReports {
    pub(super) fn new(init: &BackendInit) -> FailureReports {
        FailureReports {
            store: init.store.clone(),
            rank: init.rank as usize,
            size: init.size as usize,
            ops_run: AtomicU64::new(0),
            diagnosed: AtomicBool::new(false),
            refusals: AtomicU64::new(0),
        }
    }

    /// Counts an operation about to run: its number.
    pub(super) fn next_op(&self) -> u64 {
        self.ops_run.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Whether no failure of this rank was diagnosed yet (and none will be
    /// again: the first one claims it).
    pub(super) fn first_failure(&self) -> bool {
        !self.diagnosed.swap(true, Ordering::SeqCst)
    }

    /// After this rank's first timeout or lost connection, names the likely
    /// culprit: every rank that fails this way reports "operation number,
    /// name, kind" in the store, then waits up to [`DIAGNOSIS_WINDOW`] for
    /// the others' reports. Ranks that never report are stopped, hung, dead
    /// or not yet at this operation; ranks that failed in another operation
    /// are out of step. The store work runs on its own thread and
    /// connection, so a store host that is itself stopped costs no more
    /// than the window.
    pub(super) fn diagnose(&self, op: &Op, seq: u64, kind: ErrorKind) -> Diagnosis {
        let (me, n) = (self.rank, self.size);
        let store = self.store.clone();
        let op_name = op.name();
        let call = signature_words(op).map_or(op_name.to_string(), |w| describe_sig(&w));
        let mine = format!("{seq} {op_name} {kind:?} {call}");
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("tc-gloo-diag".into())
            .spawn(move || {
                let store = store.clone_store().unwrap_or(store);
                let _ = tx.send(collect_failure_reports(&*store, me, n, &mine));
            });
        let unknown = |why: String| Diagnosis {
            found: format!("; the other ranks' state is unknown ({why})"),
            refusal: None,
        };
        if spawned.is_err() {
            return unknown("no thread to ask the store".into());
        }
        let reports = match rx.recv_timeout(DIAGNOSIS_WINDOW + Duration::from_millis(150)) {
            Ok(Ok(reports)) => reports,
            Ok(Err(e)) => return unknown(format!("store: {}", e.message)),
            Err(_) => return unknown("the store did not answer".into()),
        };
        let refusal = reports.iter().flatten().find_map(|report| {
            let mut it = report.splitn(4, ' ');
            (it.nth(2) == Some(REFUSED_KIND)).then(|| it.next().unwrap_or("?").to_string())
        });
        Diagnosis {
            found: explain_failure_reports(&reports, me, seq, op_name, &call),
            refusal,
        }
    }

    /// Runs a refusal (see [`crate::op::Refusal`]) in the place of the
    /// refused call, for a transport whose peers wait only for the messages
    /// of their own call (Gloo over TCP; shared memory tells it in one
    /// sync): Ok once the other ranks were told. It goes through the store:
    /// when every rank refused the call (within [`REFUSAL_GRACE`]) nothing
    /// else happens and the comm stays usable; otherwise this rank's
    /// failure report names the refusal (see [`FailureReports::diagnose`])
    /// and `close` closes the comm's connections: the peers' calls fail at once, naming
    /// this rank and the reason, and the comm is unusable on every rank.
    pub(super) fn refuse(
        &self,
        refusal: &Refusal,
        d: &Deadline,
        close: &dyn Fn(&Error),
    ) -> Result<()> {
        let told = refusal.told();
        // Every refusal of a usable comm was made by every rank (a partial
        // one closes it), so the ranks count their refusals alike.
        let n = self.refusals.fetch_add(1, Ordering::Relaxed) + 1;
        let key = |r: usize| format!("refusal/{r}/{n}");
        let keys: Vec<String> = (0..self.size).map(key).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let me = self.rank;
        let every_rank = self.store.set(keys[me], told.as_bytes()).and_then(|()| {
            self.store
                .wait(&keys, Some(REFUSAL_GRACE.min(d.remaining())))
        });
        if every_rank.is_ok() {
            return Ok(());
        }
        let seq = self.ops_run.load(Ordering::Relaxed);
        self.diagnosed.store(true, Ordering::SeqCst);
        let report = format!("{seq} refused {REFUSED_KIND} {told}");
        let reported = self.store.set(&failure_report_key(me), report.as_bytes());
        close(&Error::invalid_usage(format!(
            "this rank refused a collective that not every rank refused, which closed the comm's connections: {told}"
        )));
        reported.map_err(|e| {
            Error::new(
                e.kind,
                format!(
                    "the store did not take the refusal ({}): the other ranks fail with a lost connection",
                    e.message
                ),
            )
        })
    }
}

/// What [`FailureReports::diagnose`] found: the text for the error, and what
/// a rank that refused the call (see [`FailureReports::refuse`]) told.
pub(super) struct Diagnosis {
    pub found: String,
    pub refusal: Option<String>,
}

/// How long a rank that refused a collective over Gloo waits for every
/// other rank's refusal of it before it closes the connections: long
/// enough for a rank that refuses too but is descheduled on a loaded host
/// (1 s was seen to fall short under a test run's load), short against a
/// timeout, since a call refused on one rank only is a program error.
const REFUSAL_GRACE: Duration = Duration::from_secs(3);

/// The kind in a refusing rank's failure report.
const REFUSED_KIND: &str = "Refused";

fn failure_report_key(rank: usize) -> String {
    format!("failure_report/{rank}")
}

/// Publishes this rank's failure report `mine` and collects the other
/// ranks' reports for up to [`DIAGNOSIS_WINDOW`] (None: no report).
fn collect_failure_reports(
    store: &dyn Store,
    me: usize,
    n: usize,
    mine: &str,
) -> Result<Vec<Option<String>>> {
    let key = failure_report_key;
    store.set(&key(me), mine.as_bytes())?;
    let deadline = Instant::now() + DIAGNOSIS_WINDOW;
    let mut reports: Vec<Option<String>> = vec![None; n];
    loop {
        for (r, slot) in reports.iter_mut().enumerate() {
            if r != me && slot.is_none() && store.check(&[&key(r)])? {
                *slot = Some(String::from_utf8_lossy(&store.get(&key(r))?).into_owned());
            }
        }
        let missing = reports
            .iter()
            .enumerate()
            .any(|(r, v)| r != me && v.is_none());
        if !missing || Instant::now() >= deadline {
            return Ok(reports);
        }
        std::thread::sleep(Duration::from_millis(40));
    }
}

/// "rank 3" or "ranks 1, 2, ... and N more" (at most eight named).
fn rank_list(v: &[usize]) -> String {
    let shown: Vec<String> = v.iter().take(8).map(|r| r.to_string()).collect();
    let more = if v.len() > 8 {
        format!(" and {} more", v.len() - 8)
    } else {
        String::new()
    };
    format!(
        "{} {}{more}",
        if v.len() == 1 { "rank" } else { "ranks" },
        shown.join(", ")
    )
}

/// What the other ranks' reports say about operation `seq` (`op_name`,
/// called as `call` here): who is silent, out of step or in another
/// collective.
fn explain_failure_reports(
    reports: &[Option<String>],
    me: usize,
    seq: u64,
    op_name: &str,
    call: &str,
) -> String {
    let silent: Vec<usize> = (0..reports.len())
        .filter(|r| *r != me && reports[*r].is_none())
        .collect();
    let mut parts = Vec::new();
    if !silent.is_empty() {
        parts.push(format!(
            "no failure report from {} within {} ms (stopped, hung, dead or not yet at operation #{seq})",
            rank_list(&silent),
            DIAGNOSIS_WINDOW.as_millis()
        ));
    }
    for (r, report) in reports.iter().enumerate() {
        let Some(report) = report else { continue };
        let mut it = report.splitn(4, ' ');
        let (their_seq, their_op) = (it.next().unwrap_or("?"), it.next().unwrap_or("?"));
        let their_kind = it.next().unwrap_or("?");
        let their_call = it.next().unwrap_or("?");
        if their_kind == REFUSED_KIND {
            parts.insert(0, their_call.to_string());
        } else if their_seq != seq.to_string() {
            parts.push(format!("rank {r} failed in operation #{their_seq} ({their_op}) while this rank was at #{seq} ({op_name}): the ranks are out of step"));
        } else if their_call != call {
            parts.push(format!("rank {r} called {their_call} as operation #{seq}, this rank {call}: the ranks called different collectives"));
        }
    }
    if parts.is_empty() {
        // Name them and how: a rank that arrives late learns who gave up.
        let how: Vec<String> = reports
            .iter()
            .enumerate()
            .filter_map(|(r, report)| {
                let kind = report.as_deref()?.split(' ').nth(2).unwrap_or("?");
                Some(format!("rank {r} ({kind})"))
            })
            .collect();
        return format!(
            "; every other rank failed in the same operation (#{seq}) and gave up: {}",
            how.join(", ")
        );
    }
    format!("; {}", parts.join("; "))
}
