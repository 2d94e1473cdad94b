//! Point-to-point through shared memory: every rank's segment holds one
//! ring per destination rank (a byte stream written only by this rank and
//! read only by that one), so a pair needs no lock and no system call while
//! both are running.
//!
//! A ring is a `head` word (bytes written so far, stored by the sender), a
//! `tail` word (bytes consumed so far, stored by the receiver), each on its
//! own cache line, and [`RING`] bytes of data. A message is a [`HEADER`]
//! (magic and tag, byte count, element count, dtype) followed by its bytes,
//! padded to [`ALIGN`] so that the next header never wraps; a message
//! longer than the free space goes in pieces of at most [`PIECE`] bytes, the
//! receiver copying out each piece as soon as the sender published it.
//!
//! Sends are buffered: a send completes once its last byte is in the ring,
//! so two ranks that both send first and receive next do not wait for each
//! other. A receiver matches messages on (peer, tag), in order: a message
//! that no posted receive wants is moved to the heap (an early message) and
//! handed to the next receive that asks for it. A rank whose operation
//! cannot progress drains every incoming ring that way, so a send larger
//! than the ring never waits on a peer that is itself stuck sending.
//!
//! The receiver checks each message's element count and dtype against its
//! receive: on a mismatch the receive fails with `TC_ERR_INVALID_USAGE`
//! naming both, the message is skipped and the pair stays usable; the send
//! already completed on its side.
//!
//! A receive from any source (peer [`ANY`], always an operation alone:
//! never batched nor completed at once) takes the earliest early message
//! of its tag from any peer, else the first header of its tag that a
//! pass over the rings finds; each peer's messages still match in order.
//! It tells its sender through the transfer's source slot. Any peer that
//! exits or leaves while it waits fails it, naming that peer.
//!
//! Waiting follows the collectives' syncs (see [`super::wait`]): busy
//! polling while a peer on another CPU may answer, then yields, then futex
//! sleeps of at most 10 ms between which a peer whose process exited or
//! that left the comm fails the operation at once (`TC_ERR_REMOTE`, naming
//! it), the comm's abort is seen, and the deadline gives `TC_ERR_TIMEOUT`
//! naming the peers waited for.

mod at_once;

use super::wait::current_cpu;
use super::{exited, futex_wait, futex_wake, IntraHost, SEGMENT, SLICE};
use crate::error::{Error, Result};
use crate::op::SourceSlot;
use crate::types::DType;
use crate::util::Deadline;
use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// The peer of a receive from any source.
pub(in crate::backends::gloo) const ANY: usize = usize::MAX;

/// Numbers the early messages in the order they were read, so that a
/// receive from any source takes the one that came first.
static ARRIVALS: AtomicU64 = AtomicU64::new(0);

/// Data bytes of one ring.
pub(super) const RING: usize = 1 << 20;
/// The ring's control words: head at 0, tail at 64.
const CONTROL: usize = 128;
pub(super) const RING_STRIDE: usize = CONTROL + RING;
const HEADER: usize = 32;
const ALIGN: usize = 32;
/// Largest piece published at once: the receiver starts copying out after
/// this many bytes instead of after the whole free space.
const PIECE: usize = 64 << 10;
const MAGIC: u64 = 0x7470_3270;

const _: () = assert!(RING % ALIGN == 0 && HEADER % ALIGN == 0);

/// One send or receive of an operation.
#[derive(Clone, Copy)]
pub struct Transfer {
    pub is_send: bool,
    pub peer: usize,
    pub tag: u32,
    pub buf: *mut u8,
    pub count: usize,
    pub dtype: DType,
    /// An any-source receive's slot for its sender (null otherwise);
    /// valid while the transfer runs.
    pub source: *const SourceSlot,
}

impl Transfer {
    fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// A receive that may take a message from rank `q`.
    #[inline(always)]
    fn receives_from(&self, q: usize) -> bool {
        !self.is_send && (self.peer == q || self.peer == ANY)
    }

    /// Tells an any-source receive's work that it took `q`'s message.
    fn matched(&self, q: usize) {
        // SAFETY: the slot outlives the transfer (see `source`).
        if let Some(slot) = unsafe { self.source.as_ref() } {
            slot.set(q as i32);
        }
    }

    /// "rank N" or "any source".
    fn peer_name(&self) -> String {
        match self.peer {
            ANY => "any source".into(),
            q => format!("rank {q}"),
        }
    }
}

/// Where the message being read from a ring goes.
enum Dest {
    /// Transfer `i` of the running operation.
    Recv(usize),
    /// The last early message of the inbox.
    Early,
    /// Nowhere (its receive did not match it).
    Skip,
}

struct Reading {
    dest: Dest,
    bytes: usize,
    /// `bytes` padded to [`ALIGN`]: what it occupies in the ring.
    body: usize,
    done: usize,
}

/// A message read before any receive asked for it.
struct EarlyMessage {
    tag: u32,
    count: u64,
    dtype: u64,
    data: Vec<u8>,
    complete: bool,
    /// Its place among every peer's early messages (see [`ARRIVALS`]).
    arrived: u64,
}

/// What this rank has read from one peer's ring.
#[derive(Default)]
struct Inbox {
    early: VecDeque<EarlyMessage>,
    reading: Option<Reading>,
}

/// Every peer's inbox (used by one operation at a time).
pub(in crate::backends::gloo) struct Inboxes(Vec<Inbox>);

impl Inboxes {
    pub(super) fn new(size: usize) -> Inboxes {
        Inboxes((0..size).map(|_| Inbox::default()).collect())
    }
}

/// A transfer's progress.
struct Pending {
    t: Transfer,
    done: bool,
    /// A receive that a message was matched to.
    matched: bool,
    /// Its completion was told (see [`IntraHost::point_to_point_each`]).
    told: bool,
    /// Bytes of the body moved so far, and whether the header went (sends).
    moved: usize,
    header_sent: bool,
    error: Option<String>,
}

impl Pending {
    /// `t`, nothing of it done yet.
    fn new(t: &Transfer) -> Pending {
        Pending {
            t: *t,
            done: false,
            matched: false,
            told: false,
            moved: 0,
            header_sent: false,
            error: None,
        }
    }
}

fn dtype_name(code: u64) -> &'static str {
    DType::ALL.get(code as usize).map_or("?", |d| d.name())
}

fn padded(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

impl IntraHost {
    /// Whether point-to-point goes through the rings.
    pub fn has_p2p(&self) -> bool {
        self.p2p.is_some()
    }

    /// The ring from rank `from` to rank `to` (in `from`'s segment).
    fn ring(&self, from: usize, to: usize) -> *mut u8 {
        // SAFETY: within the segment (see `segment_len`).
        unsafe { self.bases[from].add(SEGMENT + to * RING_STRIDE) }
    }

    fn head(ring: *mut u8) -> &'static AtomicU64 {
        // SAFETY: an aligned word of a mapping that outlives every use.
        unsafe { &*(ring as *const AtomicU64) }
    }

    fn tail(ring: *mut u8) -> &'static AtomicU64 {
        unsafe { &*(ring.add(64) as *const AtomicU64) }
    }

    /// Wakes rank `q` if it sleeps (after a head or tail store).
    fn notify(&self, q: usize) {
        fence(Ordering::SeqCst);
        if self.sleeping_of(q).load(Ordering::Relaxed) != 0 {
            self.bell_of(q).fetch_add(1, Ordering::SeqCst);
            futex_wake(self.bell_of(q));
        }
    }

    /// Runs `transfers` (none to this rank) to completion. Returns the
    /// receives that did not match their message (the operation's usage
    /// errors); the others completed.
    ///
    /// # Safety
    /// Every buffer is valid for its bytes until this returns.
    pub unsafe fn point_to_point(
        &self,
        transfers: &[Transfer],
        d: &Deadline,
        alive: &dyn Fn() -> Result<()>,
    ) -> Result<Vec<String>> {
        let mut errors = Vec::new();
        self.point_to_point_each(transfers, d, alive, &mut |_, why| errors.extend(why))?;
        Ok(errors)
    }

    /// [`Self::point_to_point`], telling `done(i, mismatch)` of transfer
    /// `i` as soon as it completed (`mismatch`: the receive did not match
    /// its message), once each: its buffer is no longer used from then
    /// on. On an error, the transfers not told did not complete.
    ///
    /// # Safety
    /// Every buffer is valid for its bytes until its transfer is told, or
    /// until this returns.
    pub unsafe fn point_to_point_each(
        &self,
        transfers: &[Transfer],
        d: &Deadline,
        alive: &dyn Fn() -> Result<()>,
        done: &mut dyn FnMut(usize, Option<String>),
    ) -> Result<()> {
        let Some(inboxes) = &self.p2p else {
            return Err(Error::internal("shared-memory point-to-point is off"));
        };
        let mut inboxes = crate::util::lock(inboxes);
        // A single send or receive (the latency-bound case) allocates nothing.
        let (mut one, mut many): ([Pending; 1], Vec<Pending>);
        let pend: &mut [Pending] = match transfers {
            [t] => {
                one = [Pending::new(t)];
                &mut one
            }
            _ => {
                many = transfers.iter().map(Pending::new).collect();
                &mut many
            }
        };
        for i in 0..pend.len() {
            if !pend[i].t.is_send {
                self.take_early(&mut inboxes.0, pend, i);
            }
        }
        Self::tell_done(pend, done);
        let result = self.progress_until_done(&mut inboxes.0, pend, d, alive, done);
        // Never write into a buffer of an operation that returned.
        for inbox in &mut inboxes.0 {
            if let Some(r) = &mut inbox.reading {
                if matches!(r.dest, Dest::Recv(_)) {
                    r.dest = Dest::Skip;
                }
            }
        }
        result
    }

    /// Tells `done` of the transfers that completed since the last call.
    fn tell_done(pend: &mut [Pending], done: &mut dyn FnMut(usize, Option<String>)) {
        for (i, p) in pend.iter_mut().enumerate() {
            if p.done && !p.told {
                p.told = true;
                done(i, p.error.take());
            }
        }
    }

    unsafe fn progress_until_done(
        &self,
        inboxes: &mut [Inbox],
        pend: &mut [Pending],
        d: &Deadline,
        alive: &dyn Fn() -> Result<()>,
        done: &mut dyn FnMut(usize, Option<String>),
    ) -> Result<()> {
        let cpu = current_cpu();
        self.publish_cpu(cpu);
        let mut patience = self.waits.patience(cpu);
        loop {
            if self.step(inboxes, pend, false)? {
                Self::tell_done(pend, done);
                self.waits.waited(&patience);
                patience = self.waits.patience(patience.cpu);
                continue;
            }
            if pend.iter().all(|p| p.done) {
                Self::tell_done(pend, done);
                self.waits.waited(&patience);
                return Ok(());
            }
            // Stuck: read whatever peers sent, so that a peer blocked
            // sending to this rank moves on.
            if self.step(inboxes, pend, true)? {
                Self::tell_done(pend, done);
                self.waits.waited(&patience);
                patience = self.waits.patience(patience.cpu);
                continue;
            }
            // Every other rank for an any-source receive (no allocation:
            // this loop is the latency-bound path).
            let (me, size) = (self.rank, self.size);
            let awaited = pend.iter().filter(|p| !p.done).flat_map(|p| {
                let peers = match p.t.peer {
                    ANY => 0..size,
                    q => q..q + 1,
                };
                peers.filter(move |q| *q != me)
            });
            if patience.poll_again(|cpu| self.any_on_cpu(awaited, cpu)) {
                continue;
            }
            alive()?;
            self.check_peers(pend, d)?;
            let me = self.rank;
            let seen = self.bell_of(me).load(Ordering::SeqCst);
            patience.sleeping();
            self.sleeping_of(me).store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let moved = self.step(inboxes, pend, true);
            if !matches!(moved, Ok(false)) {
                self.sleeping_of(me).store(0, Ordering::SeqCst);
                moved?;
                Self::tell_done(pend, done);
                continue;
            }
            let left = d.left().unwrap_or_default();
            futex_wait(self.bell_of(me), seen, left.min(SLICE));
            self.sleeping_of(me).store(0, Ordering::SeqCst);
        }
    }

    /// Fails when a peer that an unfinished transfer waits for exited or
    /// left the comm, or when the deadline passed.
    fn check_peers(&self, pend: &[Pending], d: &Deadline) -> Result<()> {
        let me = self.rank;
        let waiting: Vec<&Pending> = pend.iter().filter(|p| !p.done).collect();
        let what = |p: &Pending| {
            let (verb, dir) = if p.t.is_send {
                ("send", "to")
            } else {
                ("receive", "from")
            };
            let tag = match p.t.tag {
                0 => String::new(),
                t => format!(" with tag {t}"),
            };
            format!(
                "{verb} of {} {} {dir} {}{tag} through shared memory on rank {me}",
                p.t.count,
                p.t.dtype.name(),
                p.t.peer_name()
            )
        };
        // An any-source receive waits for every other rank: any of them
        // gone fails it (the one whose send it waits for may be that one).
        let peers_of = |p: &Pending| match p.t.peer {
            ANY => (0..self.size).filter(|q| *q != me).collect::<Vec<_>>(),
            q => vec![q],
        };
        for p in &waiting {
            for q in peers_of(p) {
                if self.pidfds[q].as_deref().is_some_and(exited) {
                    return Err(Error::remote(format!(
                        "{}: rank {q}'s process exited before completing it",
                        what(p)
                    )));
                }
                if self.left_of(q).load(Ordering::SeqCst) != 0 {
                    return Err(Error::remote(format!(
                        "{}: rank {q} left the comm (destroyed it) before completing it",
                        what(p)
                    )));
                }
            }
        }
        if d.left().is_err() {
            let first = waiting.first().map(|p| what(p)).unwrap_or_default();
            let mut peers: Vec<usize> = waiting.iter().flat_map(|p| peers_of(p)).collect();
            peers.sort_unstable();
            peers.dedup();
            let names: Vec<String> = peers.iter().map(|q| q.to_string()).collect();
            return Err(Error::timeout(format!(
                "{first}: rank(s) {} did not complete it in time (slow, stopped or hung, \
                 or no matching send or receive was posted there)",
                names.join(", ")
            )));
        }
        Ok(())
    }

    /// One pass over every unfinished transfer; `drain` also reads rings
    /// that no receive waits on. Whether anything moved.
    unsafe fn step(
        &self,
        inboxes: &mut [Inbox],
        pend: &mut [Pending],
        drain: bool,
    ) -> Result<bool> {
        let mut moved = false;
        // Sends to one peer go in order: only its first unfinished one moves.
        let mut blocked: Vec<usize> = Vec::new();
        for p in pend.iter_mut() {
            let q = p.t.peer;
            if !p.t.is_send || p.done || blocked.contains(&q) {
                continue;
            }
            moved |= self.push(p);
            if !p.done {
                blocked.push(q);
            }
        }
        for q in (0..self.size).filter(|q| *q != self.rank) {
            let wanted = inboxes[q].reading.is_some()
                || pend
                    .iter()
                    .any(|p| !p.done && !p.matched && p.t.receives_from(q));
            if wanted || drain {
                moved |= self.pull(q, &mut inboxes[q], pend, drain)?;
            }
        }
        Ok(moved)
    }

    /// Writes `t`'s header at byte `head` of a ring's `data` (not yet
    /// published).
    unsafe fn write_header(data: *mut u8, head: u64, t: &Transfer) {
        let words = [
            MAGIC << 32 | t.tag as u64,
            t.bytes() as u64,
            t.count as u64,
            t.dtype.to_c() as u64,
        ];
        (data.add(head as usize % RING) as *mut [u64; 4]).write(words);
    }

    /// Moves as much of send `p` into its ring as fits.
    unsafe fn push(&self, p: &mut Pending) -> bool {
        let q = p.t.peer;
        let ring = self.ring(self.rank, q);
        let data = ring.add(CONTROL);
        let (head_word, tail_word) = (Self::head(ring), Self::tail(ring));
        let mut head = head_word.load(Ordering::Relaxed);
        let mut free = RING - (head - tail_word.load(Ordering::Acquire)) as usize;
        let bytes = p.t.bytes();
        let body = padded(bytes);
        let mut moved = false;
        if !p.header_sent {
            if free < HEADER {
                return false;
            }
            Self::write_header(data, head, &p.t);
            head += HEADER as u64;
            free -= HEADER;
            p.header_sent = true;
            moved = true;
        }
        while p.moved < body && free > 0 {
            let at = head as usize % RING;
            let n = (body - p.moved).min(free).min(RING - at).min(PIECE);
            let real = n.min(bytes.saturating_sub(p.moved));
            std::ptr::copy_nonoverlapping(p.t.buf.add(p.moved), data.add(at), real);
            head += n as u64;
            free -= n;
            p.moved += n;
            head_word.store(head, Ordering::Release);
            self.notify(q);
            moved = true;
        }
        if moved && head_word.load(Ordering::Relaxed) != head {
            head_word.store(head, Ordering::Release);
            self.notify(q);
        }
        p.done = p.header_sent && p.moved == body;
        moved
    }

    /// Reads what rank `q` published: headers are matched to receives (or
    /// kept as early messages), bodies copied to their destination. A next
    /// header is read only while a receive from `q` waits for its message,
    /// or when `drain`: a message queued behind the wanted one stays in
    /// the ring for its own receive (no copy to the heap and back).
    unsafe fn pull(
        &self,
        q: usize,
        inbox: &mut Inbox,
        pend: &mut [Pending],
        drain: bool,
    ) -> Result<bool> {
        let ring = self.ring(q, self.rank);
        let data = ring.add(CONTROL);
        let (head_word, tail_word) = (Self::head(ring), Self::tail(ring));
        let head = head_word.load(Ordering::Acquire);
        let mut tail = tail_word.load(Ordering::Relaxed);
        let start = tail;
        loop {
            if inbox.reading.is_none()
                && !self.read_header(q, inbox, pend, drain, (data, head), &mut tail)?
            {
                break;
            }
            if !self.read_body(q, inbox, pend, (data, head), &mut tail, tail_word) {
                break;
            }
        }
        if tail != tail_word.load(Ordering::Relaxed) {
            tail_word.store(tail, Ordering::Release);
            self.notify(q);
        }
        Ok(tail != start)
    }

    /// [`Self::pull`]'s first step: the header at `tail` of `q`'s ring
    /// (`data` up to `head`) matched to its destination in
    /// `inbox.reading`, when a whole header is there and a receive from
    /// `q` waits for it (or `drain`); false when none was read.
    #[inline(always)]
    unsafe fn read_header(
        &self,
        q: usize,
        inbox: &mut Inbox,
        pend: &mut [Pending],
        drain: bool,
        (data, head): (*mut u8, u64),
        tail: &mut u64,
    ) -> Result<bool> {
        let unmatched = || {
            pend.iter()
                .any(|p| !p.done && !p.matched && p.t.receives_from(q))
        };
        if ((head - *tail) as usize) < HEADER || !(drain || unmatched()) {
            return Ok(false);
        }
        let [magic_tag, bytes, count, dtype] =
            (data.add(*tail as usize % RING) as *const [u64; 4]).read();
        if magic_tag >> 32 != MAGIC {
            return Err(Error::internal(format!(
                "point-to-point ring from rank {q} to rank {} is corrupt",
                self.rank
            )));
        }
        *tail += HEADER as u64;
        inbox.reading = Some(self.match_message(
            q,
            inbox,
            pend,
            (magic_tag as u32, count, dtype),
            bytes as usize,
        ));
        Ok(true)
    }

    /// [`Self::pull`]'s second step: what `q`'s ring holds (from `tail` up
    /// to `head`) of the message being read, copied to its destination;
    /// the space is given back to the sender. True when the message is
    /// complete (its destination is told and the next header may follow).
    #[inline(always)]
    unsafe fn read_body(
        &self,
        q: usize,
        inbox: &mut Inbox,
        pend: &mut [Pending],
        (data, head): (*mut u8, u64),
        tail: &mut u64,
        tail_word: &AtomicU64,
    ) -> bool {
        let Some(r) = &mut inbox.reading else {
            return false;
        };
        let at = *tail as usize % RING;
        let n = (r.body - r.done)
            .min((head - *tail) as usize)
            .min(RING - at);
        let real = n.min(r.bytes.saturating_sub(r.done));
        match r.dest {
            Dest::Recv(i) => {
                std::ptr::copy_nonoverlapping(data.add(at), pend[i].t.buf.add(r.done), real)
            }
            Dest::Early => {
                let src = std::slice::from_raw_parts(data.add(at), real);
                if let Some(e) = inbox.early.back_mut() {
                    e.data.extend_from_slice(src);
                }
            }
            Dest::Skip => {}
        }
        r.done += n;
        *tail += n as u64;
        if n > 0 {
            tail_word.store(*tail, Ordering::Release);
            self.notify(q);
        }
        if r.done < r.body {
            return false;
        }
        match r.dest {
            Dest::Recv(i) => pend[i].done = true,
            Dest::Early => {
                if let Some(e) = inbox.early.back_mut() {
                    e.complete = true;
                }
            }
            Dest::Skip => {}
        }
        inbox.reading = None;
        true
    }

    /// Where a message just announced by rank `q` goes: the first receive
    /// from `q` with its tag that no message was matched to yet, else the
    /// early messages.
    fn match_message(
        &self,
        q: usize,
        inbox: &mut Inbox,
        pend: &mut [Pending],
        (tag, count, dtype): (u32, u64, u64),
        bytes: usize,
    ) -> Reading {
        let reading = |dest| Reading {
            dest,
            bytes,
            body: padded(bytes),
            done: 0,
        };
        let waiting = pend
            .iter()
            .position(|p| !p.done && !p.matched && p.t.receives_from(q) && p.t.tag == tag);
        let Some(i) = waiting else {
            inbox.early.push_back(EarlyMessage {
                tag,
                count,
                dtype,
                data: Vec::with_capacity(bytes),
                complete: bytes == 0,
                arrived: ARRIVALS.fetch_add(1, Ordering::Relaxed),
            });
            return reading(Dest::Early);
        };
        pend[i].matched = true;
        pend[i].t.matched(q);
        if let Some(e) = self.mismatch(&pend[i].t, q, count, dtype) {
            pend[i].error = Some(e);
            pend[i].done = true;
            return reading(Dest::Skip);
        }
        if bytes == 0 {
            pend[i].done = true;
        }
        reading(Dest::Recv(i))
    }

    /// Why receive `t` cannot take rank `q`'s message of `count` elements
    /// of `dtype`.
    #[inline(always)]
    fn mismatch(&self, t: &Transfer, q: usize, count: u64, dtype: u64) -> Option<String> {
        (count != t.count as u64 || dtype != t.dtype.to_c() as u64)
            .then(|| Self::mismatch_message(t, q, count, dtype))
    }

    /// What [`IntraHost::mismatch`] says of a receive `t` that rank `q`'s
    /// send of `count` elements of type `dtype` does not match.
    #[cold]
    fn mismatch_message(t: &Transfer, q: usize, count: u64, dtype: u64) -> String {
        match t.peer {
            ANY => format!(
                "receive of {} {} from any source{} took rank {q}'s send of {count} {}, which \
                 does not match",
                t.count,
                t.dtype.name(),
                match t.tag {
                    0 => String::new(),
                    tag => format!(" with tag {tag}"),
                },
                dtype_name(dtype)
            ),
            _ => format!(
                "receive of {} {} from rank {q} does not match that rank's send of {count} {}",
                t.count,
                t.dtype.name(),
                dtype_name(dtype)
            ),
        }
    }

    /// Receive `i` takes the first early message from its peer with its
    /// tag, if any: a complete one is copied out; the one still being read
    /// is redirected to the receive's buffer.
    unsafe fn take_early(&self, inboxes: &mut [Inbox], pend: &mut [Pending], i: usize) {
        let t = pend[i].t;
        let first_of = |inbox: &Inbox| inbox.early.iter().position(|e| e.tag == t.tag);
        let found = match t.peer {
            // The earliest read of every peer's first message of the tag.
            ANY => inboxes
                .iter()
                .enumerate()
                .filter_map(|(q, inbox)| first_of(inbox).map(|k| (q, k)))
                .min_by_key(|(q, k)| inboxes[*q].early[*k].arrived),
            q => first_of(&inboxes[q]).map(|k| (q, k)),
        };
        let Some((q, k)) = found else {
            return;
        };
        let inbox = &mut inboxes[q];
        let Some(e) = inbox.early.remove(k) else {
            return;
        };
        pend[i].matched = true;
        t.matched(q);
        let mismatch = self.mismatch(&t, q, e.count, e.dtype);
        let mut redirect = |dest| {
            if let Some(r) = &mut inbox.reading {
                r.dest = dest;
            }
        };
        if let Some(why) = mismatch {
            pend[i].error = Some(why);
            pend[i].done = true;
            if !e.complete {
                redirect(Dest::Skip);
            }
            return;
        }
        std::ptr::copy_nonoverlapping(e.data.as_ptr(), t.buf, e.data.len());
        if e.complete {
            pend[i].done = true;
        } else {
            redirect(Dest::Recv(i));
        }
    }
}
