//! Flight recorder: a comm's most recent operations, for hang diagnosis.
//!
//! Every issued operation gets a sequence number and an entry in a ring of
//! `TORCHCOMM_FLIGHT_RECORDER` entries (default 64; 0 turns it off). An
//! entry keeps the operation's shape and its work handle, so a dump reads
//! each operation's live status. Collectives are numbered in issue order on
//! every rank alike, so comparing the dumps of the ranks of a stuck job
//! shows which rank is behind and in which operation. The comm logs its
//! dump when an operation fails or times out (before the process abort that
//! abort-on-error makes), and `tc_comm_dump_flight_recorder` returns it.
//!
//! Recording costs one short lock and no allocation once the ring is full.

use crate::error::ErrorKind;
use crate::op::{Op, PointToPoint};
use crate::types::DType;
use crate::work::{Work, WorkStatus};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Entries kept when `TORCHCOMM_FLIGHT_RECORDER` is unset.
pub(crate) const DEFAULT_ENTRIES: usize = 64;

/// The shape of one recorded operation.
#[derive(Clone)]
struct Entry {
    seq: u64,
    op: &'static str,
    dtype: Option<DType>,
    /// Elements this rank sends or contributes (all blocks of list and
    /// `single` variants), as `Op::elements` counts them.
    elements: usize,
    /// "root 2", "peer 1", or "" when neither applies.
    target: Target,
    async_op: bool,
    issued: Instant,
    /// None when issuing failed (then `refused` says why).
    work: Option<Arc<dyn Work>>,
    refused: Option<ErrorKind>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    None,
    Root(i32),
    Peer(i32),
    /// A batch of point-to-point operations with this many members.
    Batch(usize),
}

/// The entries, oldest first from `oldest` (wrapping) once full: a new
/// entry then replaces the oldest in place.
struct Ring {
    entries: Vec<Entry>,
    oldest: usize,
}

impl Ring {
    /// The entries, oldest first.
    fn in_order(&self) -> impl Iterator<Item = &Entry> {
        let (newer, older) = self.entries.split_at(self.oldest);
        older.iter().chain(newer)
    }
}

pub struct FlightRecorder {
    capacity: usize,
    epoch: Instant,
    /// The next sequence number; taken by [`FlightRecorder::reserve`] before
    /// an operation is recorded, so that its hooks see the same number.
    next_seq: AtomicU64,
    ring: Mutex<Ring>,
}

impl FlightRecorder {
    /// A recorder keeping the last `capacity` operations (0: records
    /// nothing, and dumps say so).
    pub fn new(capacity: usize) -> FlightRecorder {
        FlightRecorder {
            capacity,
            epoch: Instant::now(),
            next_seq: AtomicU64::new(1),
            ring: Mutex::new(Ring {
                entries: Vec::with_capacity(capacity.min(1024)),
                oldest: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        crate::util::lock(&self.ring)
    }

    /// Takes the next sequence number for an operation about to be issued.
    pub fn reserve(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Records an issued operation and its work (None with the error kind
    /// when the backend refused to issue it); returns its sequence number.
    #[cfg(test)]
    pub fn record(&self, op: &Op, async_op: bool, work: Result<&Arc<dyn Work>, ErrorKind>) -> u64 {
        let seq = self.reserve();
        self.record_as(seq, op, async_op, work, Instant::now());
        seq
    }

    /// Whether the ring keeps works (it is not off): the comm's watchdog
    /// then looks at the works of its entries ([`FlightRecorder::works`]),
    /// and those it drops unfinished are handed back to be watched.
    pub fn holds_works(&self) -> bool {
        self.capacity > 0
    }

    /// [`FlightRecorder::record`] under a number taken by
    /// [`FlightRecorder::reserve`], issued at `issued` (the caller's clock
    /// read, which the work's start may share). Returns the work of the
    /// entry it replaced when that one is not known finished: no longer
    /// in the ring, it must be watched elsewhere. Inline: its one caller
    /// (the comm's `issued`) passes its arguments on unspilled.
    #[inline]
    pub fn record_as(
        &self,
        seq: u64,
        op: &Op,
        async_op: bool,
        work: Result<&Arc<dyn Work>, ErrorKind>,
        issued: Instant,
    ) -> Option<Arc<dyn Work>> {
        if self.capacity == 0 {
            return None;
        }
        let (dtype, elements, target) = shape(op);
        let (work, refused) = match work {
            Ok(w) => (Some(w.clone()), None),
            Err(kind) => (None, Some(kind)),
        };
        let mut ring = self.lock();
        if ring.entries.len() < self.capacity {
            ring.entries.push(Entry {
                seq,
                op: op.name(),
                dtype,
                elements,
                target,
                async_op,
                issued,
                work,
                refused,
            });
            return None;
        }
        let at = ring.oldest;
        ring.oldest = if at + 1 == self.capacity { 0 } else { at + 1 };
        // Written field by field in place: no entry built and moved.
        let e = &mut ring.entries[at];
        e.seq = seq;
        e.op = op.name();
        e.dtype = dtype;
        e.elements = elements;
        e.target = target;
        e.async_op = async_op;
        e.issued = issued;
        e.refused = refused;
        let dropped = std::mem::replace(&mut e.work, work);
        // Its work is released (or handed back) outside the lock.
        drop(ring);
        dropped.filter(|w| !w.known_finished())
    }

    /// The works of the entries (a copy: their status is read outside the
    /// ring's lock).
    pub fn works(&self) -> Vec<Arc<dyn Work>> {
        let ring = self.lock();
        ring.entries.iter().filter_map(|e| e.work.clone()).collect()
    }

    /// Operations issued so far (the next sequence number minus one).
    pub fn issued(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed) - 1
    }

    /// The table of recorded operations, oldest first, under a header line
    /// naming `label`. Reads each operation's status now.
    pub fn dump(&self, label: &str) -> String {
        // Statuses are read outside the ring's lock: a device work's status
        // asks the driver, and recording must never wait for that.
        let (issued, rows): (u64, Vec<Entry>) = {
            let ring = self.lock();
            (self.issued(), ring.in_order().cloned().collect())
        };
        let mut out = String::new();
        if self.capacity == 0 {
            let _ = writeln!(out, "flight recorder of {label}: off (TORCHCOMM_FLIGHT_RECORDER=0); {issued} operations issued");
            return out;
        }
        let _ = writeln!(
            out,
            "flight recorder of {label}: last {} of {issued} operations (TORCHCOMM_FLIGHT_RECORDER={})",
            rows.len(),
            self.capacity
        );
        let _ = writeln!(
            out,
            "{:>8}  {:<22} {:<9} {:>12}  {:<10} {:<5} {:>12}  {:<12} {:>10}",
            "seq",
            "operation",
            "dtype",
            "elements",
            "root/peer",
            "async",
            "issued (ms)",
            "status",
            "age (ms)"
        );
        let now = Instant::now();
        for Entry {
            seq,
            op,
            dtype,
            elements,
            target,
            async_op,
            issued: issued_at,
            work,
            refused,
        } in rows
        {
            let status = match (&work, refused) {
                (Some(w), _) => status_name(w.status()),
                (None, Some(kind)) => refused_name(kind),
                (None, None) => "unknown",
            };
            let target = match target {
                Target::None => "-".to_string(),
                Target::Root(r) => format!("root {r}"),
                Target::Peer(crate::op::ANY_SOURCE) => "any source".to_string(),
                Target::Peer(p) => format!("peer {p}"),
                Target::Batch(n) => format!("{n} p2p"),
            };
            let _ = writeln!(
                out,
                "{seq:>8}  {op:<22} {:<9} {elements:>12}  {target:<10} {:<5} {:>12.3}  {status:<12} {:>10.1}",
                dtype.map_or("-", |d| d.name()),
                if async_op { "yes" } else { "no" },
                ms(issued_at.duration_since(self.epoch)),
                ms(now.duration_since(issued_at)),
            );
        }
        out
    }
}

/// An operation's (dtype, elements, root or peer), as [`Op::dtype`],
/// [`Op::elements`] and [`Op::signature`] give them, from one look at its
/// family.
#[inline(always)]
fn shape(op: &Op) -> (Option<DType>, usize, Target) {
    match op {
        Op::PointToPoint(PointToPoint::One(p)) => (Some(p.dtype), p.count, Target::Peer(p.peer)),
        Op::PointToPoint(PointToPoint::Batch(ops)) => {
            (op.dtype(), op.elements(), Target::Batch(ops.len()))
        }
        Op::AllToAll(_) => {
            let target = match op.signature() {
                Some((_, _, root)) if root >= 0 => Target::Root(root),
                _ => Target::None,
            };
            (op.dtype(), op.elements(), target)
        }
        _ => match op.signature() {
            Some((dtype, count, root)) => {
                let target = if root >= 0 {
                    Target::Root(root)
                } else {
                    Target::None
                };
                (dtype, count, target)
            }
            None => (None, 0, Target::None),
        },
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn status_name(s: WorkStatus) -> &'static str {
    match s {
        WorkStatus::NotStarted => "queued",
        WorkStatus::InProgress => "in progress",
        WorkStatus::Completed => "completed",
        WorkStatus::TimedOut => "timed out",
        WorkStatus::Error => "failed",
    }
}

fn refused_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Aborted => "not issued: aborted",
        ErrorKind::Timeout => "not issued: timeout",
        _ => "not issued",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::op::Ptr;
    use crate::types::{PremulFactor, RedKind, ReduceOp};
    use crate::work::DoneWork;
    use std::ffi::c_void;

    struct Pending;
    impl Work for Pending {
        fn status(&self) -> WorkStatus {
            WorkStatus::InProgress
        }
        fn wait(&self, _: *mut c_void) -> Result<()> {
            Ok(())
        }
        fn wait_blocking(&self) -> Result<()> {
            Ok(())
        }
        fn check_timeout(&self, _: Instant) -> Option<crate::error::Error> {
            None
        }
    }

    fn all_reduce(count: usize) -> Op {
        let sum = ReduceOp {
            kind: RedKind::Sum,
            factor: PremulFactor::Host(1.0),
        };
        Op::all_reduce(Ptr(8 as *mut c_void), count, DType::F32, sum)
    }

    #[test]
    fn keeps_the_last_entries_in_issue_order_with_live_status() {
        let r = FlightRecorder::new(3);
        let done: Arc<dyn Work> = Arc::new(DoneWork(Ok(())));
        let failed: Arc<dyn Work> = Arc::new(DoneWork(Err(crate::error::Error::timeout("x"))));
        let pending: Arc<dyn Work> = Arc::new(Pending);
        for i in 0..4 {
            assert_eq!(
                r.record(&all_reduce(10 + i), false, Ok(&done)),
                1 + i as u64
            );
        }
        let bcast = Op::broadcast(Ptr(8 as *mut c_void), 7, DType::I64, 2);
        assert_eq!(r.record(&bcast, true, Ok(&pending)), 5);
        assert_eq!(
            r.record(
                &Op::send(Ptr(8 as *mut c_void), 3, DType::U8, 1, 0),
                false,
                Ok(&failed)
            ),
            6
        );
        assert_eq!(r.record(&Op::Barrier, false, Err(ErrorKind::Aborted)), 7);
        assert_eq!(r.issued(), 7);
        let text = r.dump("comm 'c' (rank 0/3)");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("last 3 of 7 operations"), "{text}");
        assert_eq!(lines.len(), 2 + 3, "{text}");
        let cols = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        let b = cols(lines[2]);
        assert_eq!(
            &b[..7],
            ["5", "broadcast", "int64", "7", "root", "2", "yes"],
            "{text}"
        );
        assert!(lines[2].contains("in progress"), "{text}");
        let s = cols(lines[3]);
        assert_eq!(&s[..6], ["6", "send", "uint8", "3", "peer", "1"], "{text}");
        assert!(
            lines[3].contains("failed") || lines[3].contains("timed out"),
            "{text}"
        );
        assert!(
            lines[4].starts_with("       7  barrier") && lines[4].contains("not issued: aborted"),
            "{text}"
        );
        assert!(
            !text.contains("all_reduce"),
            "the oldest entries were dropped: {text}"
        );
    }

    #[test]
    fn a_receive_from_any_source_shows_as_such() {
        let r = FlightRecorder::new(2);
        let pending: Arc<dyn Work> = Arc::new(Pending);
        let (any, _) = Op::recv_any(Ptr(8 as *mut c_void), 2, DType::I32, 5);
        r.record(&any, true, Ok(&pending));
        let text = r.dump("comm 'c' (rank 0/2)");
        let row = text.lines().nth(2).unwrap_or_default();
        assert!(row.contains("recv") && row.contains("any source"), "{text}");
    }

    /// What the ring drops unfinished is handed back (to be watched
    /// elsewhere); what is finished, or not a work, is not.
    #[test]
    fn an_entry_dropped_unfinished_hands_its_work_back() {
        let r = FlightRecorder::new(2);
        let done: Arc<dyn Work> = Arc::new(DoneWork(Ok(())));
        let pending: Arc<dyn Work> = Arc::new(Pending);
        let record = |w: std::result::Result<&Arc<dyn Work>, ErrorKind>| {
            let seq = r.reserve();
            r.record_as(seq, &Op::Barrier, false, w, Instant::now())
        };
        assert!(record(Ok(&pending)).is_none(), "the ring has room");
        assert!(record(Ok(&done)).is_none());
        let back = record(Err(ErrorKind::Aborted)).expect("pending dropped");
        assert!(Arc::ptr_eq(&back, &pending));
        assert!(record(Ok(&done)).is_none(), "a finished work is not");
        assert!(record(Ok(&done)).is_none(), "nor a refusal");
        assert_eq!(r.works().len(), 2);
    }

    /// The recorder's one look at an operation gives what `Op::dtype`,
    /// `Op::elements` and `Op::signature` give, for every family.
    #[test]
    fn shape_agrees_with_the_op_accessors() {
        let p = |x: usize| Ptr(x as *mut c_void);
        let sum = ReduceOp::SUM;
        let f = DType::F32;
        let refused = Op::Refused(crate::op::Refusal {
            call: "tc_broadcast",
            rank: 1,
            error: crate::error::Error::invalid_argument("test"),
        });
        let ops = [
            Op::all_reduce(p(8), 5, f, sum),
            Op::reduce(p(8), 5, f, 2, sum),
            Op::reduce_scatter(p(8), vec![p(16), p(24)], 3, f, sum),
            Op::reduce_scatter_single(p(8), p(16), 3, f, sum),
            Op::reduce_scatter_v(p(8), p(16), vec![1, 2, 4], f, sum),
            Op::all_gather(vec![p(8), p(16)], p(24), 3, f),
            Op::all_gather_single(p(8), p(16), 3, f),
            Op::all_gather_v(p(8), p(16), vec![2, 5], f),
            Op::gather(vec![p(8), p(16)], p(24), 3, f, 1),
            Op::gather_single(p(8), p(16), 3, f, 0),
            Op::broadcast(p(8), 7, DType::I64, 2),
            Op::scatter(p(8), vec![p(16), p(24)], 3, f, 1),
            Op::all_to_all(vec![p(8), p(16)], vec![p(24), p(32)], 3, f),
            Op::all_to_all_single(p(8), p(16), 3, f),
            Op::all_to_all_v_single(p(8), vec![1, 6], p(16), vec![2, 3], f),
            Op::Barrier,
            refused,
            Op::send(p(8), 3, DType::U8, 1, 0),
            Op::recv(p(8), 4, DType::I32, 0, 7),
            Op::batch(vec![]),
        ];
        for op in &ops {
            let target = match op {
                Op::PointToPoint(PointToPoint::One(p)) => Target::Peer(p.peer),
                Op::PointToPoint(PointToPoint::Batch(ops)) => Target::Batch(ops.len()),
                _ => match op.signature() {
                    Some((_, _, root)) if root >= 0 => Target::Root(root),
                    _ => Target::None,
                },
            };
            assert_eq!(
                shape(op),
                (op.dtype(), op.elements(), target),
                "{}",
                op.name()
            );
        }
    }

    #[test]
    fn off_counts_but_keeps_nothing() {
        let r = FlightRecorder::new(0);
        let done: Arc<dyn Work> = Arc::new(DoneWork(Ok(())));
        r.record(&all_reduce(4), false, Ok(&done));
        r.record(&all_reduce(4), false, Ok(&done));
        let text = r.dump("comm 'c'");
        assert!(
            text.contains("off") && text.contains("2 operations issued"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1);
    }
}
