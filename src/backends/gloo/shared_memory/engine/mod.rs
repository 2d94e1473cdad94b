//! Collectives through shared memory when every rank of a comm is a
//! process of this host (the usual single-machine CPU job): all_reduce,
//! reduce, broadcast, all_gather, reduce_scatter and all_to_all in every
//! form, gather, scatter and barrier skip Gloo's TCP loopback; so do
//! sends, receives and batches (see [`p2p`]; `TORCHCOMM_SHM_P2P=0` keeps
//! those on Gloo).
//!
//! At creation each rank makes a segment (a memfd: a header, two data
//! halves of [`HALF`] bytes and one point-to-point ring per peer) and maps every peer's, after checking that the
//! peer runs on this boot of this host and that the file it opened is the
//! peer's (device and inode). The ranks then agree: the path is used only
//! if every rank mapped every segment (`TORCHCOMM_GLOO_SHM=0` turns it off;
//! one rank's refusal turns it off for all). Operations go chunk by chunk,
//! alternating halves, so that a rank writes a half only after every rank
//! has passed a synchronisation that follows its reads of it:
//!
//! - all_reduce (and reduce): copy the chunk in; sync; reduce this rank's
//!   share of the chunk across all segments in rank order (every element is
//!   reduced once, by one rank, so all ranks get identical bits) into its
//!   own segment; sync; copy every share out (reduce: the root only). Two
//!   syncs per chunk. Up to 16 KiB, one sync: after it every rank (reduce:
//!   the root) combines every rank's input itself, in rank order.
//! - broadcast: the root copies in; sync; the others copy out.
//! - all_gather_single: copy this rank's block in; sync; copy all out.
//! - reduce_scatter_single: copy a chunk of every block in; sync; reduce
//!   this rank's block across all segments into the output.
//! - all_to_all_single: copy a chunk of every block in; sync; copy block
//!   `me` of every segment out.
//! - gather and scatter: copy in (the root: every block); sync; copy out.
//! - all_gather_v and reduce_scatter_v: as their single forms, chunked by
//!   the largest count (the fingerprint below carries a digest of every
//!   rank's counts, so ranks that passed different counts all fail alike).
//! - all_to_all_v_single: a first sync shares every rank's splits (all
//!   ranks check the whole matrix alike), then chunks of every block.
//! - the list forms of all_gather, reduce_scatter and all_to_all pack their
//!   lists into one buffer and run the single forms.
//! - barrier: one sync.
//!
//! Every operation's first sync also publishes its fingerprint (the sync's
//! phase, the operation, dtype, count or counts digest, root and reduce
//! op) beside the phase word, and every rank compares all ranks' after it:
//! ranks that called different collectives all fail there with
//! `TC_ERR_INVALID_USAGE` naming the rank and the field, before any data
//! lands, and stay in step (the check needs no synchronisation of its own).
//! An operation with nothing to move still makes that one sync.
//!
//! Reductions follow the Gloo path's rules: PREMUL_SUM scales each input
//! first, AVG divides the sum, float16/bfloat16 sums add in f32 and round
//! once.
//!
//! A sync publishes this rank's phase number (and the CPU it runs on) and
//! wakes the peers that sleep (a futex on their header); it waits by busy
//! polling while that can help, then yielding, then in futex sleeps of at
//! most 10 ms (see [`wait`]), between which it checks the comm's abort, the
//! deadline and whether a missing peer's process has exited (a pidfd), so a
//! dead peer fails the operation at once and a stopped one at the timeout,
//! both named.

mod collectives;
mod p2p;
mod wait;

pub use p2p::Transfer;
pub(in crate::backends::gloo) use p2p::ANY;

use super::super::memory::{copy, Scratch};
use super::super::reduce::{self, ReduceFn, Scale};
use super::super::shm::{
    file_id, futex_wait, futex_wake, host_id, shared_file, PeerMapping, Placement,
};
use super::super::signature::{self, Fingerprint};
use crate::error::{Error, Result};
use crate::types::DType;
use crate::util::Deadline;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wait::WaitPolicy;

/// Bytes of each of a segment's two data halves: the chunk size.
pub(super) const HALF: usize = 512 << 10;
/// The header. Its first two cache lines are the sync lines, one per
/// parity of the phase (a sync at phase `p` uses line `p % 2`), each
/// written by this rank alone: the phase of its latest sync of that
/// parity (0), a fingerprint slot (from [`SLOT`], see [`Fingerprint`]) and
/// a payload of [`PAYLOAD`] bytes (from [`PAYLOAD_AT`]): a peer reads one
/// line per sync, and for a chunk that fits the payload the data comes
/// with it (`bench/sync_lines.c`, a model of the 2-rank exchange: 111–119
/// ns per round with one line, 141–158 with the fingerprint on the
/// phase's line and the data apart, 156–161 with three lines). The third
/// line holds what changes rarely or is written by peers: CPU (128, see
/// [`wait`]), bell (132), sleeping (136), left (140), gave up (144). From
/// [`REASONS`], two refusal reasons (see [`IntraHost::refuse`]).
const HEADER: usize = REASONS + 2 * REASON_BYTES;
const LINE: usize = 64;
const SLOT: usize = 8;
/// A slot's words: the fingerprint's packed fields with the low 32 bits of
/// the phase it belongs to above them, its count, its root.
const SLOT_WORDS: usize = 3;
const PAYLOAD_AT: usize = 32;
/// Bytes of a chunk that travel in the sync line.
pub(super) const PAYLOAD: usize = LINE - PAYLOAD_AT;
const CPU: usize = 2 * LINE;
const BELL: usize = CPU + 4;
const SLEEPING: usize = CPU + 8;
const LEFT: usize = CPU + 12;
const GAVE_UP: usize = CPU + 16;
const REASONS: usize = 3 * LINE;
const _: () = assert!(SLOT + SLOT_WORDS * 8 <= PAYLOAD_AT && GAVE_UP + 8 <= REASONS);
/// A reason slot: its length (8 bytes), then its text (cut to fit).
const REASON_BYTES: usize = 448;
const SEGMENT: usize = HEADER + 2 * HALF;

/// A segment's length in a comm of `size` ranks: the collectives' part,
/// then this rank's outgoing point-to-point ring to each rank.
fn segment_len(size: usize) -> usize {
    SEGMENT + size * p2p::RING_STRIDE
}
/// The longest a wait sleeps between its checks of the deadline, the
/// comm's abort and the peers' processes.
const SLICE: Duration = Duration::from_millis(10);

/// One rank's view of the comm's segments.
pub struct IntraHost {
    rank: usize,
    size: usize,
    /// Every rank's segment base here (this rank's own mapping included).
    bases: Vec<*mut u8>,
    /// Keeps the mappings (own first, then the peers'). The own one's
    /// base is `bases[rank]`, read from here where a sync writes its own
    /// header (no index check).
    own: OwnMapping,
    _peers: Vec<PeerMapping>,
    /// Per peer, a descriptor that becomes readable when it exits (shared
    /// by every comm with that peer, see [`watch_process`]).
    pidfds: Vec<Option<Arc<OwnedFd>>>,
    /// Syncs made so far (the same on every rank).
    phase: AtomicU64,
    /// Chunks sent so far: picks the half.
    chunks: AtomicU64,
    /// How its waits poll (see [`wait`]).
    waits: WaitPolicy,
    /// Names a fingerprint's operation in messages.
    describe: fn(&Fingerprint) -> String,
    /// Point-to-point through the rings, when every rank agreed to it.
    p2p: Option<std::sync::Mutex<p2p::Inboxes>>,
}

// SAFETY: the segments are accessed through atomics and under the sync
// protocol above; one operation runs at a time (the comm's order).
unsafe impl Send for IntraHost {}
unsafe impl Sync for IntraHost {}

struct OwnMapping {
    base: *mut u8,
    len: usize,
    /// Open until every peer mapped the segment (the vote), then closed:
    /// a comm keeps no descriptor of its own.
    fd: Option<OwnedFd>,
}

impl Drop for OwnMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create_segment`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

fn create_segment(len: usize) -> std::io::Result<OwnMapping> {
    let (fd, base) = shared_file("gloo intra-host segment", len)?;
    Ok(OwnMapping {
        base,
        len,
        fd: Some(fd),
    })
}

/// Whether a switch's value means off (`0`, `false`, `off`, `no`).
pub(in crate::backends::gloo) fn is_off(value: &str) -> bool {
    matches!(value.trim(), "0" | "false" | "off" | "no")
}

/// Whether an environment switch is set to off.
fn switched_off(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| is_off(&v))
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A pidfd of process `pid`, shared by every comm of this process that has
/// it as a peer (one descriptor per peer process, not per comm); a cached
/// one whose process exited is replaced (the pid may have been reused).
fn watch_process(pid: u32) -> Option<Arc<OwnedFd>> {
    static WATCHED: Mutex<BTreeMap<u32, Arc<OwnedFd>>> = Mutex::new(BTreeMap::new());
    let mut watched = crate::util::lock(&WATCHED);
    watched.retain(|_, fd| Arc::strong_count(fd) > 1 && !exited(fd));
    if let Some(fd) = watched.get(&pid) {
        return Some(fd.clone());
    }
    let fd = Arc::new(pidfd_open(pid)?);
    watched.insert(pid, fd.clone());
    Some(fd)
}

/// Whether the process behind `pidfd` has exited.
fn exited(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// Maps in, here, the pages a small operation touches first in every
/// segment (the header and the start of each data half), so that the
/// first calls of a comm take no page faults there: two or three per
/// segment, a few microseconds each.
fn prefault(bases: &[*mut u8]) {
    for base in bases {
        for at in [0, HEADER, HEADER + HALF] {
            // SAFETY: within the segment; a read of memory nobody writes
            // yet (the operations start after set-up).
            unsafe { std::ptr::read_volatile(base.add(at)) };
        }
    }
}

/// Words each rank publishes at creation.
const OFFER: usize = 8;

/// This rank's segment of `len` bytes (None when shared memory is switched
/// off or cannot be had) and its offer to the other ranks: [1, pid, fd,
/// device, inode, len, host id (2 words)], all zero without a segment.
fn offer_segment(wanted: bool, len: usize, label: &str) -> (Option<OwnMapping>, [u64; OFFER]) {
    let own = if wanted {
        create_segment(len)
            .map_err(|e| crate::log_info!("{label}: no shared segment ({e})"))
            .ok()
    } else {
        None
    };
    let mut offer = [0u64; OFFER];
    if let Some(fd) = own.as_ref().and_then(|o| o.fd.as_ref()) {
        let (dev, ino) = file_id(fd.as_raw_fd()).unwrap_or((0, 0));
        let host = host_id();
        offer = [
            1,
            std::process::id() as u64,
            fd.as_raw_fd() as u64,
            dev,
            ino,
            len as u64,
            host[0],
            host[1],
        ];
    }
    (own, offer)
}

/// The peers' segments as mapped here, by rank (this rank's own base is
/// filled in once every rank agreed).
struct Mapped {
    peers: Vec<PeerMapping>,
    bases: Vec<*mut u8>,
    pidfds: Vec<Option<Arc<OwnedFd>>>,
}

impl Mapped {
    fn new(size: usize) -> Self {
        Mapped {
            peers: Vec::new(),
            bases: vec![std::ptr::null_mut(); size],
            pidfds: (0..size).map(|_| None).collect(),
        }
    }

    /// Maps every other rank's offered segment of `len` bytes and watches
    /// its process; false at the first one that cannot be mapped here or
    /// has another length.
    fn map_peers(&mut self, rank: usize, len: usize, label: &str, offers: &[&[u64]]) -> bool {
        for (q, o) in offers.iter().enumerate().filter(|(q, _)| *q != rank) {
            let at = Placement {
                pid: o[1],
                fd: o[2],
                offset: 0,
                len: o[5],
                dev: o[3],
                ino: o[4],
            };
            match PeerMapping::map(&at) {
                Ok(m) if at.len as usize == len => {
                    self.bases[q] = m.ptr;
                    self.peers.push(m);
                    self.pidfds[q] = watch_process(o[1] as u32);
                }
                Ok(_) => return false,
                Err(e) => {
                    crate::log_info!("{label}: rank {q}'s segment cannot be mapped here ({e})");
                    return false;
                }
            }
        }
        true
    }
}

impl IntraHost {
    /// Sets up the shared segments, collectively over `all_gather` (every
    /// rank calls it, in the same order). None when any rank cannot share
    /// memory with every other: all ranks then agree to use Gloo.
    /// `p2p_wanted`: this rank's choice of shared-memory point-to-point
    /// (on only when every rank wants it).
    pub(super) fn setup(
        rank: usize,
        size: usize,
        label: &str,
        p2p_wanted: bool,
        describe: fn(&Fingerprint) -> String,
        all_gather: &dyn Fn(&[u64]) -> Result<Vec<u64>>,
    ) -> Result<Option<IntraHost>> {
        let wanted = !switched_off("TORCHCOMM_GLOO_SHM");
        let len = segment_len(size);
        let (own, offer) = offer_segment(wanted, len, label);
        let all = all_gather(&offer)?;
        let offers: Vec<&[u64]> = all.chunks(OFFER).collect();
        let ok = own.is_some()
            && offers
                .iter()
                .all(|o| o[0] == 1 && o[6..8] == offer[6..8] && offer[6..8] != [0, 0]);
        let mut mapped = Mapped::new(size);
        let ok = ok && mapped.map_peers(rank, len, label, &offers);
        // Each rank's vote and its CPU set (for the waits' policy).
        let own_cpus = wait::affinity();
        let mut vote = vec![ok as u64, p2p_wanted as u64];
        vote.extend_from_slice(&own_cpus);
        let votes = all_gather(&vote)?;
        let votes: Vec<&[u64]> = votes.chunks(vote.len()).collect();
        if !votes.iter().all(|v| v[0] == 1) {
            let why = if wanted {
                "not every rank can map every other's memory (another host?)"
            } else {
                "TORCHCOMM_GLOO_SHM=0"
            };
            crate::log_info!(
                "{label}: shared-memory collectives off ({why}); all operations use Gloo"
            );
            return Ok(None);
        }
        let Some(mut own) = own else {
            return Err(Error::internal(
                "shared-memory collectives agreed without a segment",
            ));
        };
        // Every peer has mapped it (they voted after mapping).
        own.fd = None;
        mapped.bases[rank] = own.base;
        prefault(&mapped.bases);
        // One rank's TORCHCOMM_SHM_P2P=0 keeps every rank's on Gloo (a ring
        // nobody reads would hang its sender).
        let p2p_on = votes.iter().all(|v| v[1] == 1);
        crate::log_info!(
            "{label}: shared-memory collectives on ({size} ranks on this host): every collective; point-to-point {}",
            if p2p_on { "too" } else { "through Gloo (TORCHCOMM_SHM_P2P=0 or hint gloo.shm_p2p=0 on some rank)" }
        );
        let own_parallelism = std::thread::available_parallelism().map_or(1, |c| c.get());
        let cores = wait::usable_cpus(votes.iter().map(|v| &v[2..]), &own_cpus, own_parallelism);
        let busy_spins = if size <= cores { wait::MAX_SPINS } else { 0 };
        Ok(Some(IntraHost {
            rank,
            size,
            bases: mapped.bases,
            own,
            _peers: mapped.peers,
            pidfds: mapped.pidfds,
            phase: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            waits: WaitPolicy::new(busy_spins),
            describe,
            p2p: p2p_on.then(|| std::sync::Mutex::new(p2p::Inboxes::new(size))),
        }))
    }

    /// Rank `r`'s sync line for a sync at phase `p`.
    fn sync_line(&self, r: usize, p: u64) -> *mut u8 {
        line_at(&self.bases[r], p)
    }

    /// The phase of rank `r`'s latest sync of `p`'s parity: at least `p`
    /// once `r` reached the sync at `p` (never `p + 2` while this rank has
    /// not passed `p + 1`).
    fn phase_word(&self, r: usize, p: u64) -> &AtomicU64 {
        phase_at(&self.bases[r], p)
    }

    fn arrived(&self, r: usize, p: u64) -> bool {
        self.phase_word(r, p).load(Ordering::SeqCst) >= p
    }

    /// Whether every rank reached the sync at phase `p` (the segments in
    /// turn, without an index check per rank).
    fn all_arrived(&self, p: u64) -> bool {
        self.bases
            .iter()
            .all(|base| phase_at(base, p).load(Ordering::SeqCst) >= p)
    }

    /// The payload of rank `r`'s sync line for a sync at phase `p`.
    pub(super) fn payload(&self, r: usize, p: u64) -> *mut u8 {
        // SAFETY: within the header.
        unsafe { self.sync_line(r, p).add(PAYLOAD_AT) }
    }

    fn bell_of(&self, r: usize) -> &AtomicU32 {
        bell_at(&self.bases[r])
    }

    fn sleeping_of(&self, r: usize) -> &AtomicU32 {
        sleeping_at(&self.bases[r])
    }

    /// The CPU rank `r` last ran on at a sync, plus one (0: not known);
    /// see [`wait`].
    fn cpu_of(&self, r: usize) -> &AtomicU32 {
        cpu_at(&self.bases[r])
    }

    /// Publishes the CPU this rank runs on (plus one), storing only a
    /// change: peers read the word while they wait, and an unchanged one
    /// stays in their caches. An unknown CPU (0: not looked at, see
    /// [`IntraHost::publish_own_cpu`]) leaves the word as it was.
    fn publish_cpu(&self, cpu: u32) {
        let mine = cpu_at(&self.own.base);
        if cpu != 0 && mine.load(Ordering::Relaxed) != cpu {
            mine.store(cpu, Ordering::Relaxed);
        }
    }

    /// Whether a busy poll for rank `r` may help now: the waits' policy
    /// allows polling (see [`wait`]) and `r` was not last seen on this
    /// thread's CPU.
    fn may_spin_for(&self, r: usize) -> bool {
        self.waits.polls() && self.cpu_of(r).load(Ordering::Relaxed) != wait::current_cpu()
    }

    /// Whether a rank of `ranks` was last seen on CPU `cpu` (plus one).
    fn any_on_cpu(&self, mut ranks: impl Iterator<Item = usize>, cpu: u32) -> bool {
        ranks.any(|r| self.cpu_of(r).load(Ordering::Relaxed) == cpu)
    }

    /// Set when rank `r` dropped its comm: a peer waiting for it fails
    /// at once (it issued fewer collectives) instead of at its timeout.
    fn left_of(&self, r: usize) -> &AtomicU32 {
        unsafe { &*(self.bases[r].add(LEFT) as *const AtomicU32) }
    }

    /// The phase of the sync at which rank `r` gave up waiting (0: never):
    /// it withdrew its arrival there (see [`IntraHost::give_up`]), so a
    /// late rank fails at once instead of completing with the data the
    /// rank left behind, or waiting for its own timeout.
    fn gave_up_of(&self, r: usize) -> &AtomicU64 {
        unsafe { &*(self.bases[r].add(GAVE_UP) as *const AtomicU64) }
    }

    /// Rank `r`'s reason slot for a first sync at phase `p` (alternating,
    /// as the fingerprint slots).
    fn reason_slot(&self, r: usize, p: u64) -> *mut u8 {
        // SAFETY: within the header.
        unsafe { self.bases[r].add(REASONS + (p % 2) as usize * REASON_BYTES) }
    }

    /// Rank `r`'s fingerprint slot for a first sync at phase `p`, in that
    /// phase's sync line: a rank that passed that sync and published its
    /// next operation's fingerprint (at phase `p + 1` at the earliest)
    /// never overwrites one that a slower rank is still reading.
    fn slot(&self, r: usize, p: u64) -> &[AtomicU64; SLOT_WORDS] {
        slot_at(&self.bases[r], p)
    }

    /// Publishes this rank's fingerprint for the operation whose first
    /// sync is at phase `p`; returns the slot's words as written.
    fn publish(&self, p: u64, fp: &Fingerprint) -> [u64; SLOT_WORDS] {
        let words = [tagged(fp.packed(), p), fp.count, fp.root];
        let slot = slot_at(&self.own.base, p);
        for (word, w) in slot.iter().zip(words) {
            word.store(w, Ordering::Relaxed);
        }
        words
    }

    /// Whether every rank published `words` (this rank's own, as
    /// [`IntraHost::publish`] wrote them) for the operation whose first
    /// sync is at phase `p`: then all are alike, which is all that the
    /// common case needs to know ([`IntraHost::check_fingerprints`] finds
    /// who differs otherwise).
    fn all_published(&self, p: u64, words: &[u64; SLOT_WORDS]) -> bool {
        self.bases.iter().all(|base| published_at(base, p, words))
    }

    /// Rank `r`'s fingerprint for the operation whose first sync is at phase
    /// `p`; None if `r` was not at the start of an operation there.
    fn published(&self, r: usize, p: u64) -> Option<Fingerprint> {
        let [packed, count, root] = self.published_words(r, p)?;
        Some(Fingerprint::unpack(packed, count, root))
    }

    /// [`IntraHost::published`] as raw words: what the common case, every
    /// fingerprint alike, compares.
    fn published_words(&self, r: usize, p: u64) -> Option<[u64; 3]> {
        let slot = self.slot(r, p);
        let w = |i: usize| slot[i].load(Ordering::Relaxed);
        let first = w(0);
        (first >> 32 == tagged(0, p) >> 32).then(|| [first & u64::from(u32::MAX), w(1), w(2)])
    }

    /// After the first sync of an operation whose fingerprints are not all
    /// alike ([`IntraHost::all_published`]): every rank compares every
    /// rank's fingerprint with rank 0's, so all ranks give the same answer
    /// and stay in step. On a mismatch nothing was transferred yet (data
    /// lands only after this sync), and every rank starts its next chunk
    /// on the same half.
    #[cold]
    #[inline(never)]
    fn check_fingerprints(&self, what: &str, p: u64) -> Result<()> {
        let first = self.published_words(0, p);
        if first.is_some() && (1..self.size).all(|r| self.published_words(r, p) == first) {
            return Ok(());
        }
        let Some(first) = self.published(0, p) else {
            return Err(self.out_of_step(what, 0));
        };
        let mut differ = Vec::new();
        for r in 1..self.size {
            match self.published(r, p) {
                Some(fp) if fp == first => {}
                Some(fp) => differ.push((r, fp)),
                None => return Err(self.out_of_step(what, r)),
            }
        }
        let Some((r, theirs)) = differ.first() else {
            return Ok(());
        };
        self.chunks.store(0, Ordering::Relaxed);
        let refused = (0..self.size).find(|r| {
            self.published(*r, p)
                .is_some_and(|fp| fp.op == signature::REFUSED)
        });
        if let Some(q) = refused {
            return Err(Error::invalid_usage(format!(
                "{what} through shared memory on rank {}: {} (nothing was transferred)",
                self.rank,
                self.reason(q, p)
            )));
        }
        let others = match differ.len() {
            1 => String::new(),
            _ => format!(
                " (ranks {} differ from rank 0)",
                differ
                    .iter()
                    .map(|(r, _)| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let describe = self.describe;
        Err(Error::invalid_usage(format!(
            "{what} through shared memory: rank {r} called {} but rank 0 called {}: the {} differs{others}; \
             every rank must call the same collectives in the same order with the same arguments \
             (nothing was transferred)",
            describe(theirs),
            describe(&first),
            theirs.differing_field(&first)
        )))
    }

    /// Takes part in the first sync of the other ranks' operation in place
    /// of a call this rank refused, telling them `told` (why): they fail
    /// there, naming this rank, and every rank stays in step (see
    /// [`crate::op::Refusal`]). Ok when the sync completed (every rank
    /// then failed, or refused too).
    pub fn refuse(&self, told: &str, d: &Deadline, alive: &dyn Fn() -> Result<()>) -> Result<()> {
        let p = self.phase.load(Ordering::Relaxed) + 1;
        let text = &told.as_bytes()[..told.len().min(REASON_BYTES - 8)];
        // SAFETY: this rank's own reason slot for phase `p`, which no peer
        // reads before this rank publishes the phase (as the fingerprint).
        unsafe {
            let slot = self.reason_slot(self.rank, p);
            std::ptr::write_unaligned(slot as *mut u64, text.len() as u64);
            std::ptr::copy_nonoverlapping(text.as_ptr(), slot.add(8), text.len());
        }
        let refusal = Fingerprint {
            op: signature::REFUSED,
            ..Default::default()
        };
        match self.sync("refusal", Some(&refusal), d, alive) {
            Err(e) if e.kind == crate::error::ErrorKind::InvalidUsage => Ok(()),
            other => other,
        }
    }

    /// What rank `r`, which refused the operation whose first sync is at
    /// phase `p`, told the others.
    fn reason(&self, r: usize, p: u64) -> String {
        // SAFETY: rank `r` wrote the slot before publishing phase `p`, and
        // writes it again only after every rank passed a later sync.
        unsafe {
            let slot = self.reason_slot(r, p);
            let len = (std::ptr::read_unaligned(slot as *const u64) as usize).min(REASON_BYTES - 8);
            let text = std::slice::from_raw_parts(slot.add(8), len);
            String::from_utf8_lossy(text).into_owned()
        }
    }

    fn out_of_step(&self, what: &str, r: usize) -> Error {
        Error::remote(format!(
            "{what} through shared memory on rank {}: rank {r} is in the middle of another operation \
             (the ranks are out of step, e.g. after a rank failed alone)",
            self.rank
        ))
    }

    /// Rank `r`'s data half `h`.
    pub fn half(&self, r: usize, h: usize) -> *mut u8 {
        // SAFETY: within the segment.
        unsafe { self.bases[r].add(HEADER + h * HALF) }
    }

    /// Adds one to one of this rank's own counters, returning its value
    /// before: a load and a store, not a locked add (one operation runs at
    /// a time, see the `Sync` impl; a locked add costs more than the rest of
    /// the counter's work).
    fn advance(&self, counter: &AtomicU64) -> u64 {
        let v = counter.load(Ordering::Relaxed);
        counter.store(v + 1, Ordering::Relaxed);
        v
    }

    /// The phase of the next sync.
    pub fn next_phase(&self) -> u64 {
        self.phase.load(Ordering::Relaxed) + 1
    }

    /// The half the next chunk uses.
    pub fn next_half(&self) -> usize {
        (self.advance(&self.chunks) % 2) as usize
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Wakes this rank's own sync (an abort from another thread).
    pub fn wake_self(&self) {
        self.bell_of(self.rank).fetch_add(1, Ordering::SeqCst);
        futex_wake(self.bell_of(self.rank));
    }

    /// Waits until every rank reached this sync. `first` is the operation's
    /// fingerprint at its first sync (None at later ones): published with
    /// the phase and checked against every rank's. `alive` fails when the
    /// comm was aborted.
    pub fn sync(
        &self,
        what: &str,
        first: Option<&Fingerprint>,
        d: &Deadline,
        alive: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let p = self.advance(&self.phase) + 1;
        // Before the phase store, which publishes it.
        let mine = first.map(|fp| self.publish(p, fp));
        // A sync that waits looks up its CPU (below); one that finds its
        // peers there needs none, and refreshes the published one only now
        // and then (see [`wait::CPU_LOOK_EVERY`]).
        if p % wait::CPU_LOOK_EVERY == 0 {
            self.publish_own_cpu();
        }
        phase_at(&self.own.base, p).store(p, Ordering::SeqCst);
        // Most small collectives' last rank finds every other there, alike:
        // no polling to prepare, one look at each peer's line.
        if self.wake_and_look(p, mine.as_ref()) {
            self.waits.ended_at_once();
            return Ok(());
        }
        if self.all_arrived(p) {
            self.waits.ended_at_once();
        } else {
            self.wait_all(what, p, d, alive)?;
        }
        match mine {
            Some(words) if !self.all_published(p, &words) => self.check_fingerprints(what, p),
            _ => Ok(()),
        }
    }

    /// Looks up and publishes the CPU this rank runs on, where the waits
    /// look at where ranks run (see [`wait`]), and returns it; 0
    /// (unknown) where they do not, without looking.
    fn publish_own_cpu(&self) -> u32 {
        if !self.waits.tracks_cpus() {
            return 0;
        }
        let cpu = wait::current_cpu();
        self.publish_cpu(cpu);
        cpu
    }

    /// After this rank's phase store at phase `p`: wakes the peers that
    /// sleep, then tells whether every peer is there, with `mine` (this
    /// rank's fingerprint words, at an operation's first sync) in its slot,
    /// one look at each peer's line. A peer that is not sleeping needs no
    /// bell: it raises `sleeping` before its last look at the phases (both
    /// SeqCst), so either it sees this rank's phase or this rank sees it
    /// sleeping. A spinning peer's header line is only read, not written.
    /// (The bells have a loop of their own: a futex call inside the look's
    /// loop made it save and reload its state around each, about 25
    /// instructions a sleeping peer.)
    fn wake_and_look(&self, p: u64, mine: Option<&[u64; SLOT_WORDS]>) -> bool {
        for (r, base) in self.bases.iter().enumerate() {
            if r != self.rank && sleeping_at(base).load(Ordering::SeqCst) != 0 {
                bell_at(base).fetch_add(1, Ordering::SeqCst);
                futex_wake(bell_at(base));
            }
        }
        self.bases.iter().enumerate().all(|(r, base)| {
            r == self.rank
                || phase_at(base, p).load(Ordering::SeqCst) >= p
                    && mine.map_or(true, |words| published_at(base, p, words))
        })
    }

    /// Rings every peer's bell, sleeping or not: after a change that
    /// their waits check only between polls (a withdrawal, leaving the
    /// comm), so that a wait that read the bell before the change does
    /// not sleep through it.
    fn ring_peers(&self) {
        for r in (0..self.size).filter(|r| *r != self.rank) {
            self.bell_of(r).fetch_add(1, Ordering::SeqCst);
            if self.sleeping_of(r).load(Ordering::SeqCst) != 0 {
                futex_wake(self.bell_of(r));
            }
        }
    }

    /// Waits until every rank's phase reached `p`; a rank that fails here
    /// gives up (see [`IntraHost::give_up`]). Out of line: the common
    /// sync (every rank there at the first look) never comes here.
    #[inline(never)]
    fn wait_all(
        &self,
        what: &str,
        p: u64,
        d: &Deadline,
        alive: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let cpu = self.publish_own_cpu();
        match self.wait_for_peers(what, p, cpu, d, alive) {
            Ok(()) => Ok(()),
            Err(e) => self.give_up(p, e),
        }
    }

    /// After this rank's wait at phase `p` failed with `err` (timeout,
    /// abort, a peer gone): withdraws its arrival, so that a rank arriving
    /// later neither passes the sync nor reads this rank's contribution,
    /// and marks the phase given up, so that it fails at once naming this
    /// rank. Every peer that arrived meanwhile (seen after the withdrawal:
    /// one of the two ranks always sees the other's store) completes the
    /// sync instead.
    #[cold]
    fn give_up(&self, p: u64, err: Error) -> Result<()> {
        let me = self.rank;
        // Back to the line's previous sync (none before phase 2).
        self.phase_word(me, p)
            .store(p.saturating_sub(2), Ordering::SeqCst);
        let mut others = (0..self.size).filter(|r| *r != me);
        if others.all(|r| self.arrived(r, p)) {
            self.phase_word(me, p).store(p, Ordering::SeqCst);
            return Ok(());
        }
        self.gave_up_of(me).store(p, Ordering::SeqCst);
        self.ring_peers();
        Err(err)
    }

    /// Waits until every rank's phase reached `p`.
    /// `cpu`: where this rank published it runs (see [`wait`]).
    fn wait_for_peers(
        &self,
        what: &str,
        p: u64,
        cpu: u32,
        d: &Deadline,
        alive: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let me = self.rank;
        // SeqCst: the re-check after raising `sleeping` must not be ordered
        // before it (a waker that saw `sleeping` clear relies on it).
        // The spin checks allocate nothing: only a wait that goes on to the
        // slow path lists who is late.
        let arrived = |r: &usize| self.arrived(*r, p);
        let all_arrived = || (0..self.size).all(|r| arrived(&r));
        // Busy while a peer on another CPU may arrive any moment, then
        // yield the CPU to a peer that may need it (see [`wait`]).
        let mut patience = self.waits.patience(cpu);
        loop {
            let seen = self.bell_of(me).load(Ordering::SeqCst);
            if all_arrived() {
                // Where this rank runs now (it may have yielded and
                // moved), for its peers' next waits.
                self.publish_cpu(patience.cpu);
                self.waits.waited(&patience);
                return Ok(());
            }
            let late = (0..self.size).filter(|r| !arrived(r));
            if patience.poll_again(|cpu| self.any_on_cpu(late, cpu)) {
                continue;
            }
            alive()?;
            let late: Vec<usize> = (0..self.size).filter(|r| !arrived(r)).collect();
            let names = || {
                late.iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if let Some(e) = self.never_coming(what, &late) {
                return Err(e);
            }
            let left = match d.left() {
                Ok(left) => left,
                Err(_) => {
                    return Err(Error::timeout(format!(
                    "{what} through shared memory on rank {me}: rank(s) {} did not arrive in time \
                         (slow, stopped or hung, or it issued fewer collectives than this rank)",
                    names()
                )))
                }
            };
            patience.sleeping();
            self.sleeping_of(me).store(1, Ordering::SeqCst);
            if all_arrived() {
                self.sleeping_of(me).store(0, Ordering::SeqCst);
                self.waits.waited(&patience);
                return Ok(());
            }
            futex_wait(self.bell_of(me), seen, left.min(SLICE));
            self.sleeping_of(me).store(0, Ordering::SeqCst);
        }
    }

    /// Why late ranks `late` will never reach this sync, if one will not:
    /// its process exited, it gave up waiting (see [`IntraHost::give_up`]),
    /// or it left the comm.
    #[cold]
    fn never_coming(&self, what: &str, late: &[usize]) -> Option<Error> {
        let me = self.rank;
        if let Some(q) = late
            .iter()
            .find(|q| self.pidfds[**q].as_deref().is_some_and(exited))
        {
            return Some(Error::remote(format!(
                "{what} through shared memory on rank {me}: rank {q}'s process exited before reaching it"
            )));
        }
        let gave_up: Vec<String> = late
            .iter()
            .filter(|q| self.gave_up_of(**q).load(Ordering::SeqCst) != 0)
            .map(|q| q.to_string())
            .collect();
        if !gave_up.is_empty() {
            return Some(Error::remote(format!(
                "{what} through shared memory on rank {me}: rank(s) {} gave up waiting for this operation \
                 (timed out or aborted before every rank arrived) and withdrew their part: it cannot complete",
                gave_up.join(", ")
            )));
        }
        if let Some(q) = late
            .iter()
            .find(|q| self.left_of(**q).load(Ordering::SeqCst) != 0)
        {
            return Some(Error::remote(format!(
                "{what} through shared memory on rank {me}: rank {q} left the comm (destroyed it) before reaching it: \
                 the ranks issued different numbers of collectives"
            )));
        }
        None
    }
}

impl Drop for IntraHost {
    /// Tells peers still waiting for this rank that it will not come.
    fn drop(&mut self) {
        self.left_of(self.rank).store(1, Ordering::SeqCst);
        self.ring_peers();
    }
}

/// How a reduction combines the ranks' contributions.
pub struct Reduction {
    pub dtype: DType,
    pub f: ReduceFn,
    /// PREMUL_SUM's factor, applied to each contribution first.
    pub premul: Option<f64>,
    /// AVG: divide the sum by the number of ranks.
    pub avg: bool,
    /// float16/bfloat16 sums: add in f32, round once.
    pub halves: bool,
}

/// A fingerprint's packed fields (below bit 32) with the low 32 bits of
/// phase `p` above them: a reader tells its slot's phase from the two
/// others it can hold (`p - 2`, a stale one; never `p + 2`, see
/// [`IntraHost::slot`]).
fn tagged(packed: u64, p: u64) -> u64 {
    debug_assert!(packed >> 32 == 0);
    packed | p << 32
}

// The header's hot words, from a rank's segment base (a reference into
// the engine's `bases`, whose mappings live as long as the engine): the
// syncs go through them segment by segment, with no index check per rank.

/// The segment's sync line for a sync at phase `p`.
fn line_at(base: &*mut u8, p: u64) -> *mut u8 {
    // SAFETY: within the header.
    unsafe { base.add((p % 2) as usize * LINE) }
}

/// The segment's phase word for phase `p`'s parity (see
/// [`IntraHost::phase_word`]).
fn phase_at(base: &*mut u8, p: u64) -> &AtomicU64 {
    // SAFETY: the line's first word, aligned, in a live mapping.
    unsafe { &*(line_at(base, p) as *const AtomicU64) }
}

/// The segment's fingerprint slot for a first sync at phase `p` (see
/// [`IntraHost::slot`]).
fn slot_at(base: &*mut u8, p: u64) -> &[AtomicU64; SLOT_WORDS] {
    // SAFETY: aligned words within the line, in a live mapping.
    unsafe { &*(line_at(base, p).add(SLOT) as *const [AtomicU64; SLOT_WORDS]) }
}

/// Whether the segment's fingerprint slot for a first sync at phase `p`
/// holds `words`.
fn published_at(base: &*mut u8, p: u64, words: &[u64; SLOT_WORDS]) -> bool {
    let slot = slot_at(base, p);
    (0..SLOT_WORDS).all(|i| slot[i].load(Ordering::Relaxed) == words[i])
}

fn bell_at(base: &*mut u8) -> &AtomicU32 {
    // SAFETY: an aligned word of the header, in a live mapping.
    unsafe { &*(base.add(BELL) as *const AtomicU32) }
}

fn cpu_at(base: &*mut u8) -> &AtomicU32 {
    // SAFETY: an aligned word of the header, in a live mapping.
    unsafe { &*(base.add(CPU) as *const AtomicU32) }
}

fn sleeping_at(base: &*mut u8) -> &AtomicU32 {
    // SAFETY: an aligned word of the header, in a live mapping.
    unsafe { &*(base.add(SLEEPING) as *const AtomicU32) }
}

/// A synchronisation of all ranks, named for messages.
pub type SyncAll<'a> = dyn Fn(&str) -> Result<()> + 'a;

/// The share `[start, start + len)` of `m` elements that rank `r` of `n`
/// reduces: the first `m % n` ranks take one more.
pub fn share(m: usize, n: usize, r: usize) -> (usize, usize) {
    let (q, extra) = (m / n, m % n);
    (r * q + r.min(extra), q + usize::from(r < extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_chunk_once() {
        for m in [0, 1, 5, 7, 1024, 1031] {
            for n in 1..6 {
                let mut next = 0;
                for r in 0..n {
                    let (s, l) = share(m, n, r);
                    assert_eq!(s, next, "m {m} n {n} r {r}");
                    next += l;
                }
                assert_eq!(next, m);
            }
        }
    }
}
