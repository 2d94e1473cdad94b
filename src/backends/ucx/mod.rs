//! UCX (UCP tag matching) as the host transport between hosts.
//!
//! [`UcxTransport`] owns one comm's UCP context, worker and endpoints
//! (`worker.rs`), bootstrapped through the comm's store (each rank
//! publishes its worker address under `ucx/address/<rank>`; the store is
//! already scoped by the comm). It runs point-to-point (`p2p.rs`) and the
//! collectives of `collectives.rs` on the calling thread: no service
//! thread, the caller's deadline and abort checked in every wait, and a
//! peer that UCX reports failed (error handling mode "peer") named in the
//! error. After a failure the transport closes its endpoints by force, so
//! that its peers fail at once instead of at their timeout.
//!
//! Its interface to the host backend is narrow: [`UcxTransport::open`]
//! (local; fails where UCX is absent), [`UcxTransport::connect`], the
//! host transports' interface ([`Transport`]: one method per family; it
//! carries every member, and leaves refusals to the comm's store),
//! [`UcxTransport::flush`] and
//! [`wanted`] (the `TORCHCOMM_HOST_TRANSPORT` setting). It shares only the
//! reduction kernels of `crate::kernels::reduce` with the Gloo path.
//!
//! Tags (64 bits): the class in bits 63..62 (point-to-point head,
//! point-to-point data, collective, wire-up), the sender's rank in bits
//! 61..44, then for point-to-point the caller's tag in bits 31..0 (and bit
//! 40 set on a head that carries only the descriptor), for collectives the
//! operation's number in bits 43..20 and its step in bits 19..0. UCX
//! matches the messages of one sender and tag in order.
//!
//! Every collective tells its right-hand neighbour what this rank called
//! (`fingerprint.rs`), in the message its first step sends that neighbour
//! when it has one (`collectives.rs`): calls that differ across ranks fail
//! every rank at once, naming the ranks and the field that differ.

mod collectives;
mod fingerprint;
mod loader;
mod p2p;
mod window;
mod worker;

pub use window::{SameHostMemory, UcxWindow};

use crate::backends::host_executor::IdleWake;
use crate::backends::transport::{Call, Transport};
use crate::error::{Error, Result};
use crate::op::{AllToAll, Gather, Op, P2p, Reduction, Refusal, Scatter};
use crate::store::StoreRef;
use crate::util::{lock, Deadline};
use fingerprint::Fingerprint;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use worker::Worker;

/// How often the comm's idle progress thread progresses the worker while
/// a window has a buffer registered.
const IDLE_PROGRESS: Duration = Duration::from_millis(1);

/// How many ranks the tags can name (18 bits).
const MAX_RANKS: usize = 1 << 18;

/// The UCX transport of one comm (see the module documentation).
pub struct UcxTransport {
    state: Mutex<State>,
    /// The comm's timeout, which bounds [`UcxTransport::flush`].
    timeout: Duration,
    /// Collectives larger than this (bytes as every rank passes them, see
    /// [`UcxTransport::leaves`]) go to the next transport; None: every
    /// size.
    largest: Option<usize>,
    /// Windows with a buffer registered (`window.rs`): while there are,
    /// the comm's idle progress thread progresses the worker.
    windows: AtomicUsize,
    /// Wakes that thread when the first buffer is registered (it sleeps
    /// until the next operation while none is).
    idle_wake: OnceLock<IdleWake>,
    /// Why the comm broke or was aborted, once it did: ends the windows'
    /// waits (the comm's operations see it through their `alive`).
    broken: Mutex<Option<Error>>,
}

/// What one operation at a time uses, under one lock.
struct State {
    w: Worker,
    /// Collectives run so far: the number in their tags.
    collectives: u32,
    /// Where the left-hand neighbour's check message lands (kept, since
    /// it is sized for a folded payload).
    inbox: collectives::Inbox,
    spare: collectives::Spare,
}

// The worker's raw pointers are used by one thread at a time, under the lock.
unsafe impl Send for UcxTransport {}
unsafe impl Sync for UcxTransport {}

/// What a rank's settings ask for between hosts: `TORCHCOMM_HOST_TRANSPORT`
/// or the comm's hint `gloo.host_transport` (which wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostChoice {
    /// `gloo`: Gloo over TCP only.
    Gloo,
    /// `ucx`: UCX for every operation.
    Ucx,
    /// Unset (or `auto`): UCX for the collectives up to
    /// [`DEFAULT_LARGEST`] bytes and every point-to-point transfer when the
    /// ranks span hosts and every rank loaded UCX, Gloo otherwise.
    Auto,
}

impl HostChoice {
    /// The rank's choice as one word of the comm's agreement.
    pub fn word(self) -> u64 {
        match self {
            HostChoice::Gloo => 0,
            HostChoice::Ucx => 1,
            HostChoice::Auto => 2,
        }
    }

    /// The choice a word of the agreement stands for.
    pub fn from_word(w: u64) -> HostChoice {
        match w {
            0 => HostChoice::Gloo,
            1 => HostChoice::Ucx,
            _ => HostChoice::Auto,
        }
    }
}

/// The largest collective (its per-rank count times its element size, as
/// every rank passes it) UCX carries when chosen by default: above it the
/// Gloo path is faster over TCP (`make bench-multihost`, 2 and 4 ranks:
/// UCX ahead up to 4 MiB, behind at 16 and 64 MiB on loopback).
pub(crate) const DEFAULT_LARGEST: usize = 8 << 20;

/// The rank's choice of transport between hosts (see [`HostChoice`]); a
/// value other than `ucx`, `gloo` or `auto` is an error naming the setting.
pub fn wanted(hint: Option<&str>) -> Result<HostChoice> {
    let env = std::env::var("TORCHCOMM_HOST_TRANSPORT")
        .ok()
        .filter(|v| !v.is_empty());
    let (value, from) = match (hint, env) {
        (Some(h), _) => (h.to_string(), "the comm hint gloo.host_transport"),
        (None, Some(e)) => (e, "TORCHCOMM_HOST_TRANSPORT"),
        (None, None) => return Ok(HostChoice::Auto),
    };
    match value.to_ascii_lowercase().as_str() {
        "ucx" => Ok(HostChoice::Ucx),
        "gloo" => Ok(HostChoice::Gloo),
        "auto" => Ok(HostChoice::Auto),
        _ => Err(Error::invalid_argument(format!(
            "{from} is '{value}'; it takes ucx, gloo or auto"
        ))),
    }
}

/// The largest collective UCX carries when chosen by default: the comm
/// hint `gloo.ucx_largest` or `TORCHCOMM_UCX_LARGEST` (bytes), else
/// [`DEFAULT_LARGEST`]; anything but a whole number is an error naming the
/// setting.
pub fn largest(setting: Option<String>) -> Result<u64> {
    let Some(v) = setting else {
        return Ok(DEFAULT_LARGEST as u64);
    };
    v.trim().parse::<u64>().map_err(|_| {
        Error::invalid_argument(format!(
            "TORCHCOMM_UCX_LARGEST (or the hint gloo.ucx_largest) is '{v}'; it takes a number \
             of bytes"
        ))
    })
}

impl UcxTransport {
    /// Loads UCX and makes this rank's context and worker (local: no peer
    /// is contacted). Fails where UCX is absent or unusable.
    pub fn open(rank: i32, size: i32, name: &str, timeout: Duration) -> Result<UcxTransport> {
        if size as usize > MAX_RANKS {
            return Err(Error::unsupported(format!(
                "the UCX transport carries at most {MAX_RANKS} ranks, not {size}"
            )));
        }
        let eager = collectives::LARGEST_CHECK_MESSAGE;
        let w = Worker::open(rank as usize, size as usize, name, eager)?;
        Ok(UcxTransport {
            state: Mutex::new(State {
                w,
                collectives: 0,
                inbox: collectives::Inbox::new(),
                spare: collectives::Spare::new(),
            }),
            timeout,
            largest: None,
            windows: AtomicUsize::new(0),
            idle_wake: OnceLock::new(),
            broken: Mutex::new(None),
        })
    }

    /// The same transport carrying collectives of at most `largest` bytes
    /// (None: every size); point-to-point transfers of every size.
    pub fn carrying_up_to(self, largest: Option<usize>) -> UcxTransport {
        UcxTransport { largest, ..self }
    }

    /// Whether `op` is a collective larger than this transport carries: its
    /// size from what every rank passes alike (the per-rank count, the
    /// total of agreed v-counts; all_to_all_v_single's differ and count as
    /// 0), so that every rank leaves it alike.
    #[inline]
    fn leaves(&self, op: &Op) -> bool {
        let Some(largest) = self.largest else {
            return false;
        };
        let bytes = match op.signature() {
            Some((Some(dtype), count, _)) => count.saturating_mul(dtype.size()),
            _ => return false,
        };
        if bytes <= largest {
            return false;
        }
        crate::log_trace!(
            "ucx: {} of {bytes} bytes is above the {largest} bytes UCX carries by default: \
             the next transport runs it",
            op.name()
        );
        true
    }

    /// Fails once the comm broke or was aborted (see [`Transport::abort`]).
    pub(crate) fn alive(&self) -> Result<()> {
        match &*lock(&self.broken) {
            None => Ok(()),
            Some(e) => Err(Error::new(
                e.kind,
                format!("the comm is unusable: {}", e.message),
            )),
        }
    }

    /// Called by the comm's progress thread while it has nothing to run:
    /// progresses the worker (unless an operation holds it) while a window
    /// has a buffer registered, so that peers' operations emulated over
    /// active messages (UCX over TCP) complete even while this rank makes
    /// no call. Returns when to be called again (None: no window needs it;
    /// [`UcxTransport::window_registered`] wakes the thread).
    pub fn progress_idle(&self) -> Option<Duration> {
        if self.windows.load(Ordering::Acquire) == 0 {
            return None;
        }
        if let Ok(s) = self.state.try_lock() {
            s.w.progress();
        }
        Some(IDLE_PROGRESS)
    }

    /// What wakes the comm's idle progress thread (see
    /// [`UcxTransport::progress_idle`]).
    pub fn attach_idle_wake(&self, wake: IdleWake) {
        let _ = self.idle_wake.set(wake);
    }

    /// A window registered a buffer: the idle progress thread starts
    /// progressing the worker.
    fn window_registered(&self) {
        if self.windows.fetch_add(1, Ordering::AcqRel) == 0 {
            if let Some(wake) = self.idle_wake.get() {
                wake.wake();
            }
        }
    }

    /// A window's buffer was deregistered.
    fn window_deregistered(&self) {
        self.windows.fetch_sub(1, Ordering::AcqRel);
    }

    /// "UCX 1.13.1 (libucp.so.0)".
    pub fn version(&self) -> String {
        let s = lock(&self.state);
        format!("UCX {} ({})", s.w.ucp.version, s.w.ucp.origin)
    }

    /// Connects every rank through the store (collective): endpoints to
    /// every peer, then one message each way between every pair, so that
    /// every connection exists (and reports its peer's failure) before the
    /// first operation.
    pub fn connect(&self, store: &StoreRef, d: &Deadline) -> Result<()> {
        let w = &mut lock(&self.state).w;
        w.connect(store, d)?;
        let alive = || Ok(());
        collectives::wire_up(w, d, &alive)
    }

    /// Runs `f` as this comm's next collective (its number counts every
    /// collective offered, carried here or not), checked against the
    /// neighbours' calls (`mine`, see `fingerprint.rs`).
    unsafe fn collective(
        &self,
        what: &'static str,
        mine: Fingerprint,
        call: &Call,
        f: impl FnOnce(&mut collectives::Ctx<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut state = lock(&self.state);
        let st = &mut *state;
        st.collectives = st.collectives.wrapping_add(1);
        crate::log_trace!("ucx: {what} (collective {})", st.collectives);
        let mut ctx = collectives::Ctx::new(
            &mut st.w,
            st.collectives,
            (call.deadline, call.alive, what),
            mine,
            (&mut st.inbox, &mut st.spare),
        );
        let r = f(&mut ctx);
        // Whatever `f` did, the check message is sent and the neighbour's
        // taken, so that no receive outlives the call.
        let checked = ctx.finish_check(r.is_ok());
        r.and(checked)
    }

    /// A collective larger than this transport carries, which the next
    /// transport runs (None) once every rank agreed to it: the neighbour
    /// check and a barrier. Ranks whose calls differ may stand on either
    /// side of the limit, the others then running the collective here; the
    /// barrier keeps a rank whose neighbours happen to agree with it from
    /// going on to the next transport alone, where it would wait for its
    /// timeout: it fails with the rest. Costs a barrier against a
    /// collective of more than `largest` bytes.
    unsafe fn hand_on(
        &self,
        what: &'static str,
        mine: Fingerprint,
        call: &Call,
    ) -> Option<Result<()>> {
        match self.collective(what, mine, call, |c| c.barrier()) {
            Ok(()) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Waits (up to the comm's timeout) until every send that completed
    /// early reached its peer.
    pub fn flush(&self, alive: &dyn Fn() -> Result<()>) -> Result<()> {
        lock(&self.state)
            .w
            .flush(&Deadline::after(self.timeout), alive)
    }
}

/// Every operation among all ranks (flat), or the leaders' steps of a
/// hierarchical comm; refusals are told through the comm's store.
impl Transport for UcxTransport {
    fn name(&self) -> &'static str {
        "ucx"
    }

    fn carries(&self) -> String {
        match self.largest {
            None => format!("every operation ({})", self.version()),
            Some(b) => format!(
                "point-to-point, and collectives of at most {b} bytes ({})",
                self.version()
            ),
        }
    }

    unsafe fn reduction(&self, r: &Reduction, call: &Call) -> Option<Result<()>> {
        if self.leaves(call.op) {
            return self.hand_on(r.name(), Fingerprint::of_reduction(r), call);
        }
        Some(
            self.collective(r.name(), Fingerprint::of_reduction(r), call, |c| {
                c.run_reduction(r)
            }),
        )
    }

    unsafe fn gather(&self, g: &Gather, call: &Call) -> Option<Result<()>> {
        if self.leaves(call.op) {
            return self.hand_on(g.name(), Fingerprint::of_gather(g), call);
        }
        Some(
            self.collective(g.name(), Fingerprint::of_gather(g), call, |c| {
                c.run_gather(g)
            }),
        )
    }

    unsafe fn scatter(&self, s: &Scatter, call: &Call) -> Option<Result<()>> {
        if self.leaves(call.op) {
            return self.hand_on(s.name(), Fingerprint::of_scatter(s), call);
        }
        Some(
            self.collective(s.name(), Fingerprint::of_scatter(s), call, |c| {
                c.run_scatter(s)
            }),
        )
    }

    unsafe fn all_to_all(&self, a: &AllToAll, call: &Call) -> Option<Result<()>> {
        if self.leaves(call.op) {
            return self.hand_on(a.name(), Fingerprint::of_all_to_all(a), call);
        }
        Some(
            self.collective(a.name(), Fingerprint::of_all_to_all(a), call, |c| {
                c.run_all_to_all(a)
            }),
        )
    }

    fn barrier(&self, call: &Call) -> Option<Result<()>> {
        // SAFETY: a barrier moves no caller memory.
        Some(unsafe {
            self.collective("barrier", Fingerprint::of_barrier(), call, |c| c.barrier())
        })
    }

    unsafe fn point_to_point(&self, transfers: &[P2p], call: &Call) -> Option<Result<()>> {
        Some(p2p::run(
            &mut lock(&self.state).w,
            transfers,
            call.deadline,
            call.alive,
        ))
    }

    fn refuse(&self, _: &Refusal, _: &Call) -> Option<Result<()>> {
        None
    }

    /// The comm broke or was aborted: unless an operation is running (it
    /// sees the same through `alive` and withdraws itself), tells every
    /// peer (see `Worker::withdraw`) and closes the endpoints, so that the
    /// peers' operations fail now rather than at their timeout.
    fn abort(&self, why: &Error) {
        lock(&self.broken).get_or_insert_with(|| why.clone());
        if let Ok(mut s) = self.state.try_lock() {
            s.w.withdraw(&mut [], why);
        }
    }
}

/// Tag classes (bits 63..62).
const CLASS_P2P_HEAD: u64 = 0;
const CLASS_P2P_DATA: u64 = 1;
const CLASS_COLLECTIVE: u64 = 2;
const CLASS_WIRE_UP: u64 = 3;
/// On a point-to-point head: the payload follows as its own message.
const HEAD_DESCRIPTOR_ONLY: u64 = 1 << 40;
/// Every bit but [`HEAD_DESCRIPTOR_ONLY`].
const HEAD_MASK: u64 = !HEAD_DESCRIPTOR_ONLY;

/// Where a tag carries its sender's rank (bits 61..44).
const SENDER_SHIFT: u32 = 44;
/// The sender's bits of a tag: a receive from any sender masks them out.
const SENDER_BITS: u64 = ((MAX_RANKS as u64) - 1) << SENDER_SHIFT;

fn tag(class: u64, sender: usize, low: u64) -> u64 {
    (class << 62) | ((sender as u64) << SENDER_SHIFT) | (low & ((1 << SENDER_SHIFT) - 1))
}

/// The sender's rank a tag made by [`tag`] carries.
fn sender_of(tag: u64) -> usize {
    ((tag & SENDER_BITS) >> SENDER_SHIFT) as usize
}
