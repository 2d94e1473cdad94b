//! Reconfigurable comms: torchcomms' fault-tolerance API
//! (`enable_reconfigure`, `get_init_handle`, `reconfigure`).
//!
//! A comm created with `enable_reconfigure` has no members yet: it only
//! holds what forming one needs (the job's store, backend, device, name,
//! options) and its init handle, a string naming the job, the comm's name
//! and a random id of this process's comm. The processes publish their
//! handles (how is up to them); then each member of the comm to be calls
//! [`Reconfigurable::reconfigure`] with the same uuid and handles. A member
//! that was in a comm before and a newcomer that never was do the same, so
//! one call shrinks, grows, reorders or forms a comm for the first time;
//! processes whose handles are not listed take no part.
//!
//! Like split and shrink, a reconfigure first checks through the store that
//! the members passed the same handles in the same order
//! ([`super::agreement`]), under `<name>/reconfigure/<uuid>/members`, then
//! makes a new comm ([`Comm::with_store`]) whose backend meets in the store
//! under `<name>/reconfigure/<uuid>/<hash of the member list>`: two
//! reconfigures never mix keys unless they have the same uuid and the same
//! members, which each member refuses (a uuid serves one reconfigure of a
//! comm). The new comm replaces the old one in place, as torchcomms does:
//! the handle's rank and size are the new ones, the old comm is stopped
//! (its outstanding works and window calls fail with `TC_ERR_ABORTED`),
//! and its timeout, abort-on-error setting and abort hook carry over. A
//! reconfigure that fails leaves the comm as it was.
//!
//! On nccl the new comm is a fresh NCCL comm of the members (its id passed
//! through the store, as at creation), whatever NCCL is loaded; the old
//! one is aborted as above. NCCL's own ncclCommShrink/ncclCommGrow would
//! reuse the old comm's resources; they are not used.
//!
//! The comms this handle held stay allocated until the handle is dropped,
//! so that a reference to the current comm (taken by a call that raced
//! with a reconfigure) never dangles; a call on an old comm fails as on an
//! aborted one. Reconfigures are rare, so this costs little memory.

use super::{check_comm_name, Comm, CommOptions, State, GENERATED_NAMES};
use crate::backends;
use crate::config::config;
use crate::error::{Error, ErrorKind, Result};
use crate::store::prefix::PrefixStore;
use crate::store::StoreRef;
use crate::types::{Device, Hints};
use crate::util::lock;
use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// First field of every init handle (and its format's version).
const HANDLE_PREFIX: &str = "torchcomm-init-1";
/// Store key, at the store's root, of the job's id (see [`job_id`]).
const JOB_KEY: &str = "torchcomm/job_id";

/// The comm behind a C handle: formed at creation, or reconfigurable.
pub enum CommSlot {
    Fixed(Arc<Comm>),
    Reconfigurable(Box<Reconfigurable>),
}

impl CommSlot {
    /// The current comm; an error while a reconfigurable one has none yet.
    #[inline]
    pub fn get(&self) -> Result<&Arc<Comm>> {
        match self {
            CommSlot::Fixed(comm) => Ok(comm),
            CommSlot::Reconfigurable(r) => r.current().ok_or_else(|| r.pending_error()),
        }
    }

    /// The current comm, if there is one.
    pub fn formed(&self) -> Option<&Arc<Comm>> {
        match self {
            CommSlot::Fixed(comm) => Some(comm),
            CommSlot::Reconfigurable(r) => r.current(),
        }
    }

    /// The comm's device (known before a reconfigurable comm is formed).
    pub fn device(&self) -> Device {
        match self {
            CommSlot::Fixed(comm) => comm.device(),
            CommSlot::Reconfigurable(r) => r.device,
        }
    }

    /// The reconfigurable part; an error naming `call` for a fixed comm.
    pub fn reconfigurable(&self, call: &str) -> Result<&Reconfigurable> {
        match self {
            CommSlot::Reconfigurable(r) => Ok(r),
            CommSlot::Fixed(comm) => Err(Error::invalid_usage(format!(
                "{call}: comm '{}' was not created with enable_reconfigure",
                comm.name()
            ))),
        }
    }
}

/// A comm created with `enable_reconfigure` (see the module's text).
pub struct Reconfigurable {
    backend_name: String,
    device: Device,
    name: String,
    local_rank: i32,
    /// The job's store, unscoped.
    store: StoreRef,
    /// Creation options: the first comm's timeout and abort-on-error, and
    /// the default hints of every comm formed.
    timeout: Duration,
    abort_on_error: Option<bool>,
    hints: Hints,
    /// This comm's init handle (ASCII), and the job id others are checked
    /// against.
    handle: CString,
    job: String,
    /// The current comm: null until the first reconfigure, else a comm in
    /// `held`.
    current: AtomicPtr<Arc<Comm>>,
    /// Every comm formed, kept (boxed, so at a fixed address while the
    /// list grows) until drop.
    #[allow(clippy::vec_box)]
    held: Mutex<Vec<Box<Arc<Comm>>>>,
    /// Uuids this comm took part in a reconfigure with; also serializes
    /// reconfigures.
    used: Mutex<HashSet<i64>>,
    /// Finalized (or aborted) while no comm was formed.
    ended: AtomicBool,
}

/// The parts of a parsed init handle.
struct HandleParts<'a> {
    job: &'a str,
    name: &'a str,
}

impl Reconfigurable {
    /// A reconfigurable comm with no members: resolves the store (from
    /// `opts.store`, else the environment as `Comm::new` does) and makes the
    /// init handle. `opts.rank` and `opts.world_size` serve only the
    /// environment bootstrap of the store.
    pub fn new(backend_name: &str, device: Device, opts: CommOptions) -> Result<Reconfigurable> {
        // What each reconfigure will need, checked now rather than at the
        // first one (not collective: nothing else is set up yet).
        backends::available(backend_name)?;
        let timeout = opts.timeout.unwrap_or(config().timeout);
        let (store, local_rank) = match opts.store {
            Some(store) => (
                store,
                crate::bootstrap::local_rank_from_environment()?.unwrap_or(0),
            ),
            None => {
                let boot =
                    crate::bootstrap::from_environment(opts.rank, opts.world_size, None, timeout)?;
                (boot.store, boot.local_rank)
            }
        };
        let name = opts
            .name
            .unwrap_or_else(|| format!("comm{}", GENERATED_NAMES.fetch_add(1, Ordering::Relaxed)));
        check_comm_name(&name)?;
        let job = job_id(&store)?;
        let handle = CString::new(format!("{HANDLE_PREFIX}/{job}/{name}/{}", random_hex()?))
            .map_err(|_| Error::invalid_argument("argument 'opts.name': contains a NUL byte"))?;
        Ok(Reconfigurable {
            backend_name: backend_name.to_string(),
            device,
            name,
            local_rank,
            store,
            timeout,
            abort_on_error: opts.abort_on_error,
            hints: opts.hints,
            handle,
            job,
            current: AtomicPtr::new(std::ptr::null_mut()),
            held: Mutex::new(Vec::new()),
            used: Mutex::new(HashSet::new()),
            ended: AtomicBool::new(false),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// This comm's init handle: the same string for the comm's lifetime.
    pub fn init_handle(&self) -> &CStr {
        &self.handle
    }

    fn own_handle(&self) -> &str {
        self.handle.to_str().unwrap_or_default()
    }

    /// The current comm, if one was formed.
    pub fn current(&self) -> Option<&Arc<Comm>> {
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: `p` is null or the address of a box in `held`, which only
        // grows and is dropped with `self`.
        unsafe { p.as_ref() }
    }

    fn pending_error(&self) -> Error {
        Error::invalid_usage(format!(
            "comm '{}' has no members yet: it was created with enable_reconfigure; call \
             tc_comm_reconfigure first",
            self.name
        ))
    }

    /// Finalizes the current comm; with none, only marks this one ended.
    pub fn finalize(&self) -> Result<()> {
        match self.current() {
            Some(comm) => comm.finalize(),
            None if self.ended.swap(true, Ordering::AcqRel) => Err(Error::invalid_usage(format!(
                "comm '{}' was already finalized",
                self.name
            ))),
            None => Ok(()),
        }
    }

    /// Aborts the current comm; with none, marks this one ended.
    pub fn abort(&self) {
        match self.current() {
            Some(comm) => comm.abort(),
            None => self.ended.store(true, Ordering::Release),
        }
    }

    /// Re-forms the comm from the members whose handles are `handles`
    /// (ranked in list order, or with `as_set` in the order of the handles'
    /// text, the same on every member whatever order each passed).
    /// Collective over those members only, with the same `uuid`; blocks
    /// until the new comm is formed or `timeout` (default: the comm's
    /// timeout) passed. `hints` (default: the creation's) go to the new
    /// backend. See the module's text for what happens to the old comm.
    pub fn reconfigure(
        &self,
        uuid: i64,
        handles: &[&str],
        as_set: bool,
        timeout: Option<Duration>,
        hints: Hints,
    ) -> Result<()> {
        if uuid < 0 {
            return Err(Error::invalid_argument(format!(
                "argument 'uuid': {uuid} is negative"
            )));
        }
        let (members, me) = self.checked_members(handles, as_set)?;
        let mut used = lock(&self.used);
        if self.ended.load(Ordering::Acquire)
            || self
                .current()
                .is_some_and(|c| matches!(*lock(&c.state), State::Finalized))
        {
            return Err(Error::invalid_usage(format!(
                "comm '{}' was finalized: reconfigure it before tc_comm_finalize",
                self.name
            )));
        }
        if !used.insert(uuid) {
            return Err(Error::invalid_usage(format!(
                "argument 'uuid': comm '{}' already took part in a reconfigure with uuid {uuid}; \
                 each reconfigure needs a new one",
                self.name
            )));
        }
        let old = self.current();
        let comm = self.form(uuid, &members, me, timeout, hints, old)?;
        let mut held = lock(&self.held);
        held.push(Box::new(comm));
        let newest: *const Arc<Comm> = &**held.last().expect("just pushed");
        self.current
            .store(newest as *mut Arc<Comm>, Ordering::Release);
        drop(held);
        drop(used);
        if let Some(old) = old {
            old.retire(&format!("reconfigured (uuid {uuid})"));
        }
        Ok(())
    }

    /// Makes the comm of `members` (this one at `me`) once they agreed,
    /// with the settings of `old` (the comm now held, if any).
    fn form(
        &self,
        uuid: i64,
        members: &[&str],
        me: usize,
        timeout: Option<Duration>,
        hints: Hints,
        old: Option<&Arc<Comm>>,
    ) -> Result<Arc<Comm>> {
        let op_timeout = old.map_or(self.timeout, |c| c.timeout());
        let timeout = timeout.unwrap_or(op_timeout);
        let size = members.len();
        let what = format!(
            "reconfiguring comm '{}' (uuid {uuid}, this member rank {me} of {size})",
            self.name
        );
        let scope = format!("{}/reconfigure/{uuid}", self.name);
        self.agree_on_members(&scope, members, me, timeout)
            .map_err(|e| e.context(&what))?;
        let backend_store: StoreRef = Arc::new(PrefixStore::new(
            &format!("{scope}/{:016x}", fnv1a(members.join(",").as_bytes())),
            self.store.clone(),
        ));
        let opts = CommOptions {
            abort_on_error: Some(old.map_or(
                self.abort_on_error.unwrap_or(config().abort_on_error),
                |c| c.abort_on_error(),
            )),
            hints: if hints.is_empty() {
                self.hints.clone()
            } else {
                hints
            },
            ..Default::default()
        };
        let comm = Comm::with_store(
            &self.backend_name,
            self.device,
            self.name.clone(),
            me as i32,
            size as i32,
            self.local_rank,
            backend_store,
            timeout,
            &opts,
            None,
            |init| backends::create(&self.backend_name, init),
        )
        .map_err(|e| e.context(&what))?;
        // The operations' default timeout is the comm's, not the
        // reconfigure's.
        comm.timeout_ms
            .store(op_timeout.as_millis() as u64, Ordering::Relaxed);
        if let Some(old) = old {
            let hook = lock(&old.abort_hook).take();
            *lock(&comm.abort_hook) = hook;
        }
        Ok(comm)
    }

    /// `handles` checked (each a handle of this job and comm name, none
    /// twice, this comm's among them) and, with `as_set`, sorted; with this
    /// comm's place among them.
    fn checked_members<'h>(
        &self,
        handles: &[&'h str],
        as_set: bool,
    ) -> Result<(Vec<&'h str>, usize)> {
        if handles.is_empty() {
            return Err(Error::invalid_argument(
                "argument 'init_handles': empty; list every member of the new comm, this one \
                 included",
            ));
        }
        let mut seen = std::collections::HashMap::new();
        for (i, h) in handles.iter().enumerate() {
            let arg = format!("argument 'init_handles[{i}]'");
            let parts = parse_handle(h).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{arg}: {:?} is not an init handle (tc_comm_get_init_handle gives them)",
                    h.chars().take(120).collect::<String>()
                ))
            })?;
            if parts.job != self.job {
                return Err(Error::invalid_argument(format!(
                    "{arg}: handle {h:?} is of another job (its store's job id is {}, this \
                     comm's {}): members must share the store",
                    parts.job, self.job
                )));
            }
            if parts.name != self.name {
                return Err(Error::invalid_argument(format!(
                    "{arg}: handle {h:?} is of comm '{}', not of this comm '{}'",
                    parts.name, self.name
                )));
            }
            if let Some(j) = seen.insert(*h, i) {
                return Err(Error::invalid_argument(format!(
                    "{arg}: handle {h:?} repeats init_handles[{j}]"
                )));
            }
        }
        let mut members = handles.to_vec();
        if as_set {
            members.sort_unstable();
        }
        let me = members
            .iter()
            .position(|h| *h == self.own_handle())
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "argument 'init_handles': this comm's own handle {:?} is not in the list; \
                     only the members of the new comm call tc_comm_reconfigure (one that \
                     leaves finalizes its comm instead)",
                    self.own_handle()
                ))
            })?;
        Ok((members, me))
    }

    /// Checks through the store that every member passed `members` in this
    /// order: names a member that passed others or never came.
    fn agree_on_members(
        &self,
        scope: &str,
        members: &[&str],
        me: usize,
        timeout: Duration,
    ) -> Result<()> {
        // Keys by each handle's last part (its random id): handles hold '/'.
        let id = |h: &str| h.rsplit('/').next().unwrap_or(h).to_string();
        let ids: Vec<String> = members.iter().map(|h| id(h)).collect();
        let mine = ids.join(",");
        let rank_of = |peer: &str| ids.iter().position(|i| i == peer).unwrap_or(0);
        let agreement = super::agreement::Agreement {
            store: &self.store,
            scope: &format!("{scope}/members"),
            timeout,
        };
        agreement
            .agree(
                &ids[me],
                &mine,
                ids.iter().map(String::as_str),
                |peer, why| {
                    let r = rank_of(peer);
                    Error::timeout(format!(
                        "the member at rank {r} (handle {:?}) did not call tc_comm_reconfigure \
                     within {} ms: {why}",
                        members[r],
                        timeout.as_millis()
                    ))
                },
                |peer, theirs| {
                    let r = rank_of(peer);
                    let mut a: Vec<&str> = theirs.split(',').collect();
                    let mut b: Vec<&str> = ids.iter().map(String::as_str).collect();
                    a.sort_unstable();
                    b.sort_unstable();
                    let how = if a == b {
                        "the same handles in another order"
                    } else {
                        "other handles"
                    };
                    Error::invalid_usage(format!(
                        "the member at rank {r} (handle {:?}) passed {how} ({} of them); every \
                     member must pass the same handles, in the same order (or all as a set), \
                     with the same uuid",
                        members[r],
                        a.len()
                    ))
                },
            )
            .map_err(|e| match e.kind {
                ErrorKind::Remote | ErrorKind::System => e.context("the comm's store"),
                _ => e,
            })
    }
}

/// The job's id: a random value the first process of the job put in its
/// store, so equal exactly for the comms sharing a store.
fn job_id(store: &StoreRef) -> Result<String> {
    let mine = random_hex()?;
    let current = store.compare_set(JOB_KEY, b"", mine.as_bytes())?;
    let job = String::from_utf8_lossy(&current).into_owned();
    if job.len() != 32 || !job.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::invalid_usage(format!(
            "the store's key {JOB_KEY:?} holds {job:?}, not a job id: it is the library's"
        )));
    }
    Ok(job)
}

/// 128 random bits as 32 hex digits.
fn random_hex() -> Result<String> {
    let mut bytes = [0u8; 16];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: writes at most the rest of `bytes`.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::system("getrandom for a comm's init handle", err));
        }
        filled += n as usize;
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `torchcomm-init-1/<job>/<name>/<id>`, or None.
fn parse_handle(h: &str) -> Option<HandleParts<'_>> {
    let mut parts = h.split('/');
    let (prefix, job, name, id) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex32 = |s: &str| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (parts.next().is_none()
        && prefix == HANDLE_PREFIX
        && hex32(job)
        && hex32(id)
        && !name.is_empty())
    .then_some(HandleParts { job, name })
}

/// FNV-1a, 64 bits: a short, stable name for a member list.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_parse_and_refuse_other_text() {
        let job = "0123456789abcdef0123456789abcdef";
        let id = "fedcba9876543210fedcba9876543210";
        let h = format!("{HANDLE_PREFIX}/{job}/c/{id}");
        let p = parse_handle(&h).unwrap();
        assert_eq!((p.job, p.name), (job, "c"));
        for bad in [
            String::new(),
            "gloo:0:0:127.0.0.1:29500".to_string(),
            format!("{HANDLE_PREFIX}/{job}/c"),
            format!("{HANDLE_PREFIX}/{job}/c/{id}/x"),
            format!("{HANDLE_PREFIX}/{job}//{id}"),
            format!("{HANDLE_PREFIX}/xyz/c/{id}"),
            format!("torchcomm-init-2/{job}/c/{id}"),
        ] {
            assert!(parse_handle(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn random_ids_differ() {
        let a = random_hex().unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, random_hex().unwrap());
    }
}
