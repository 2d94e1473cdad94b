//! Checks and diagnosis: the broken state after a failure, the error of a
//! failed Gloo call, the diagnosis that names the rank at fault, and the
//! opt-in collective check (`TORCHCOMM_CHECK_COLLECTIVES`).

use super::*;
use crate::store::Store;

impl GlooBackend {
    pub(super) fn check_not_broken(&self) -> Result<()> {
        match &*lock(&self.broken) {
            None => Ok(()),
            Some(e) => Err(Error::new(
                if e.kind == ErrorKind::Aborted {
                    ErrorKind::Aborted
                } else {
                    e.kind
                },
                format!(
                    "gloo context of comm '{}' is unusable after an earlier failure: {}",
                    self.name, e.message
                ),
            )),
        }
    }

    /// Marks the context unusable and closes its connections, so that blocked
    /// peers fail now rather than at their timeout.
    pub(super) fn mark_broken(&self, err: &Error) {
        let first = {
            let mut b = lock(&self.broken);
            let first = b.is_none();
            b.get_or_insert_with(|| err.clone());
            first
        };
        if first {
            self.routes.abort(self, err);
        }
    }

    /// Converts a shim failure of `what` into an error; failures that leave
    /// the context unusable break it.
    pub(super) fn fail(&self, what: &str, e: shim::CallError) -> Error {
        let peer = e
            .peer
            .or_else(|| self.peer_in_message(&e.message))
            .map(|p| format!(" (peer rank {p})"))
            .unwrap_or_default();
        let kind = e.kind();
        let hint = match kind {
            ErrorKind::Timeout => "; a peer is slow, stopped or gone",
            ErrorKind::Remote => "; a peer failed or closed its connection",
            _ => "",
        };
        let err = Error::new(
            kind,
            format!(
                "gloo {what} on rank {}{peer}: {}{hint}",
                self.rank, e.message
            ),
        );
        if matches!(
            kind,
            ErrorKind::Timeout | ErrorKind::Remote | ErrorKind::Internal
        ) {
            self.mark_broken(&err);
        }
        err
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
        let (me, n) = (self.rank as usize, self.size as usize);
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
    /// refused call, when no transport before Gloo carries it (shared
    /// memory does: one sync): Ok once the other ranks were told. Over Gloo
    /// (or UCX) a peer waits only for
    /// the messages of its own call, so the refusal goes through the store:
    /// when every rank refused the call (within [`REFUSAL_GRACE`]) nothing
    /// else happens and the comm stays usable; otherwise this rank's
    /// failure report names the refusal (see [`GlooBackend::diagnose`]) and
    /// the connections are closed: the peers' calls fail at once, naming
    /// this rank and the reason, and the comm is unusable on every rank.
    pub(super) fn refuse_through_store(&self, refusal: &Refusal, d: &Deadline) -> Result<()> {
        let told = refusal.told();
        // Every refusal of a usable comm was made by every rank (a partial
        // one closes it), so the ranks count their refusals alike.
        let n = self.refusals.fetch_add(1, Ordering::Relaxed) + 1;
        let key = |r: usize| format!("refusal/{r}/{n}");
        let keys: Vec<String> = (0..self.size as usize).map(key).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let me = self.rank as usize;
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
        self.mark_broken(&Error::invalid_usage(format!(
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

    pub(super) fn all_gather_words(
        &self,
        mine: &[u64],
        d: &Deadline,
        what: &str,
    ) -> Result<Vec<u64>> {
        let n = self.size as usize;
        let mut all = vec![0u64; mine.len() * n];
        if n == 1 {
            all.copy_from_slice(mine);
            return Ok(all);
        }
        let tag = self.next_tag();
        let t = d.left()?;
        // SAFETY: both buffers are sized for the call.
        unsafe {
            self.ctx().allgather(
                mine.as_ptr() as *const u8,
                all.as_mut_ptr() as *mut u8,
                std::mem::size_of_val(mine),
                tag,
                t,
            )
        }
        .map_err(|e| self.fail(what, e))?;
        Ok(all)
    }

    pub(super) fn check_collective(&self, op: &Op, d: &Deadline) -> Result<()> {
        let Some(sig) = signature_words(op) else {
            return Ok(());
        };
        let mine = [sig[0], sig[1], sig[2], sig[3], sig[4], 0, 0, 0];
        let all = self.all_gather_words(&mine, d, "collective check")?;
        let me = self.rank as usize;
        for (r, theirs) in all.chunks(8).enumerate() {
            if theirs != mine {
                return Err(Error::invalid_usage(format!(
                    "TORCHCOMM_CHECK_COLLECTIVES: rank {me} called {} but rank {r} called {}",
                    describe_sig(&mine),
                    describe_sig(theirs)
                )));
            }
        }
        Ok(())
    }

    /// All ranks must pass the same per-rank counts to a v-variant.
    pub(super) fn agree_counts(&self, what: &str, counts: &[usize], d: &Deadline) -> Result<()> {
        let mine: Vec<u64> = counts.iter().map(|c| *c as u64).collect();
        let all = self.all_gather_words(&mine, d, what)?;
        for (r, theirs) in all.chunks(mine.len()).enumerate() {
            if theirs != mine.as_slice() {
                return Err(Error::invalid_usage(format!(
                    "{what}: ranks disagree on the per-rank counts: rank {} has {:?}, rank {r} has {:?}",
                    self.rank, mine, theirs
                )));
            }
        }
        Ok(())
    }
}

/// What [`GlooBackend::diagnose`] found: the text for the error, and what
/// a rank that refused the call (see [`GlooBackend::refuse_through_store`]) told.
pub(super) struct Diagnosis {
    pub found: String,
    pub refusal: Option<String>,
}

/// How long a rank that refused a collective over Gloo waits for every
/// other rank's refusal of it before it closes the connections.
const REFUSAL_GRACE: Duration = Duration::from_secs(1);

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
