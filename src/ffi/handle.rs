//! Handles given to C callers, and the check every call makes on them.
//!
//! Each object handed out (comm, work, store, window, batch, reducer,
//! local device group) is boxed and its
//! address recorded, with its type, in a process-wide registry of live
//! handles. Every call looks its handle arguments up there before touching
//! them, so a freed handle (a double free, a call after destroy), a pointer
//! to zeroed or garbage memory, or a handle of another type (a comm passed as
//! a work) is refused with `TC_ERR_INVALID_ARGUMENT` ("handle is not a live
//! tc_work_t") instead of being dereferenced: no memory the registry does
//! not vouch for is ever read. Freeing removes the entry first (the handle is
//! dead from then on), then keeps the allocation itself in a quarantine for
//! the next [`QUARANTINE`] frees, so that a just-freed address is not handed
//! out again at once and a double free of it is caught even if new handles
//! of the same type were made in between. Only a handle freed long ago whose
//! address a new handle of the same type now has cannot be told apart.

use crate::error::{Error, Result};
use std::alloc::Layout;
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, PoisonError, RwLock};

/// The C type of a handle, as the registry records it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum HandleType {
    Comm,
    Work,
    Store,
    Window,
    Batch,
    Reducer,
    Local,
    AllGatherP,
}

impl HandleType {
    fn c_name(self) -> &'static str {
        match self {
            HandleType::Comm => "tc_comm_t",
            HandleType::Work => "tc_work_t",
            HandleType::Store => "tc_store_t",
            HandleType::Window => "tc_window_t",
            HandleType::Batch => "tc_batch_t",
            HandleType::Reducer => "tc_reducer_t",
            HandleType::Local => "tc_local_t",
            HandleType::AllGatherP => "tc_all_gather_p_t",
        }
    }
}

/// A Rust type handed to C as an opaque handle.
pub trait Handle: Sized {
    const TYPE: HandleType;
}

/// How many freed handle allocations are kept from reuse.
const QUARANTINE: usize = 256;

/// Hashes a (registry) key, a heap address: a multiply spreads its aligned
/// bits, the shift brings high bits down to where the table indexes. The
/// default SipHash would cost more than the rest of the check.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(self.0 ^ *b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        let h = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 29);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64)
    }
}

type LiveHandles = HashMap<usize, HandleType, BuildHasherDefault<AddressHasher>>;

#[derive(Default)]
struct Registry {
    live: LiveHandles,
    /// Freed allocations (address, layout), oldest first.
    quarantine: VecDeque<(usize, Layout)>,
}

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(Default::default);

/// Changes made to the live handles so far: raised, under the registry's
/// write lock, by every insertion and removal. A handle found live when it
/// read `n` is still live while it reads `n`.
static CHANGES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The handle this thread last found live: (key, type, [`CHANGES`] read
    /// before the look). A thread calls with the same comm over and over:
    /// while nothing changed, its next check is two compares instead of the
    /// registry's lock and table (about 40 instructions of every call).
    static LAST_LIVE: Cell<(usize, Option<HandleType>, u64)> =
        const { Cell::new((0, None, u64::MAX)) };
}

/// The registry's key of an address: its complement, so that the table holds
/// no pointer to the handle and a leak checker still sees a leaked handle as
/// lost rather than reachable from the registry.
fn key<T>(p: *const T) -> usize {
    !(p as usize)
}

fn not_live<T: Handle>(arg: &str, found: Option<HandleType>) -> Error {
    let why = match found {
        Some(other) => format!("it is a live {}", other.c_name()),
        None => "freed already, or never made by this library".to_string(),
    };
    Error::invalid_argument(format!(
        "argument '{arg}': handle is not a live {} ({why})",
        T::TYPE.c_name()
    ))
}

/// The type of the live handle at `addr`, if there is one.
fn live_type<T>(p: *const T) -> Option<HandleType> {
    let registry = REGISTRY.read().unwrap_or_else(PoisonError::into_inner);
    registry.live.get(&key(p)).copied()
}

/// The error for `p`, which is not a live `T`; kept out of line so that the
/// check every call makes stays small.
#[cold]
#[inline(never)]
fn refusal<T: Handle>(p: *const T, arg: &str) -> Error {
    if p.is_null() {
        return Error::null_argument(arg);
    }
    not_live::<T>(arg, live_type(p))
}

/// Checks that `p` is a live handle of type `T`.
#[inline]
fn check<T: Handle>(p: *const T, arg: &str) -> Result<()> {
    if !p.is_null() {
        // Read before the look: a change made meanwhile leaves the stamp
        // stale, so the next check looks again.
        let changes = CHANGES.load(Ordering::Acquire);
        let seen = (key(p), Some(T::TYPE), changes);
        if LAST_LIVE.with(Cell::get) == seen {
            return Ok(());
        }
        if live_type(p) == Some(T::TYPE) {
            LAST_LIVE.with(|last| last.set(seen));
            return Ok(());
        }
    }
    Err(refusal(p, arg))
}

/// Counts a change of the live handles (`_registry`: held for writing).
fn changed(_registry: &mut Registry) {
    CHANGES.fetch_add(1, Ordering::Release);
}

/// Moves a Rust object to the C side as an owned, registered handle.
pub fn into_handle<T: Handle>(value: T) -> *mut T {
    let p = Box::into_raw(Box::new(value));
    let mut registry = REGISTRY.write().unwrap_or_else(PoisonError::into_inner);
    registry.live.insert(key(p), T::TYPE);
    changed(&mut registry);
    p
}

/// Borrows the live handle `p` (argument `arg`): NULL is
/// `TC_ERR_NULL_ARGUMENT`, anything but a live `T` `TC_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// No other thread may free `p` while the borrow lasts (the API's contract).
#[inline]
pub unsafe fn handle_ref<'a, T: Handle>(p: *const T, arg: &str) -> Result<&'a T> {
    check(p, arg)?;
    Ok(&*p)
}

/// Like [`handle_ref`], mutably, for handles that are not thread-safe.
///
/// # Safety
/// As [`handle_ref`], and no other borrow of `p` may be in use.
#[inline]
pub unsafe fn handle_mut<'a, T: Handle>(p: *mut T, arg: &str) -> Result<&'a mut T> {
    check(p, arg)?;
    Ok(&mut *p)
}

/// Takes back the live handle `p` for destruction: NULL gives `None`. The
/// handle is dead (unregistered) before its object is dropped, and its
/// allocation goes to the quarantine, whose oldest entry is released.
///
/// # Safety
/// No other thread may use `p` during the call (the API's contract).
pub unsafe fn take_handle<T: Handle>(p: *mut T, arg: &str) -> Result<Option<T>> {
    if p.is_null() {
        return Ok(None);
    }
    let (value, oldest) = {
        let mut registry = REGISTRY.write().unwrap_or_else(PoisonError::into_inner);
        match registry.live.remove(&key(p)) {
            Some(t) if t == T::TYPE => changed(&mut registry),
            found => {
                if let Some(other) = found {
                    registry.live.insert(key(p), other);
                }
                return Err(not_live::<T>(arg, found));
            }
        }
        // Moved out under the lock: once queued, the allocation is released
        // by the QUARANTINE-th free after this one, whichever thread makes it.
        let value = std::ptr::read(p);
        registry
            .quarantine
            .push_back((p as usize, Layout::new::<T>()));
        let oldest = (registry.quarantine.len() > QUARANTINE)
            .then(|| registry.quarantine.pop_front())
            .flatten();
        (value, oldest)
    };
    if let Some((addr, layout)) = oldest {
        // Allocated by Box::new with the layout of its type, which is what
        // was recorded; handle types are never zero-sized.
        std::alloc::dealloc(addr as *mut u8, layout);
    }
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[derive(Debug)]
    struct Apple(#[allow(dead_code)] u64);
    impl Handle for Apple {
        const TYPE: HandleType = HandleType::Work;
    }
    #[derive(Debug)]
    struct Pear(#[allow(dead_code)] u64);
    impl Handle for Pear {
        const TYPE: HandleType = HandleType::Comm;
    }

    #[test]
    fn live_handles_pass_and_dead_or_foreign_ones_are_named() {
        let a = into_handle(Apple(1));
        assert!(unsafe { handle_ref(a, "a") }.is_ok());
        let as_pear = unsafe { handle_ref(a as *const Pear, "p") }.unwrap_err();
        assert_eq!(as_pear.kind, ErrorKind::InvalidArgument);
        assert!(
            as_pear
                .message
                .contains("not a live tc_comm_t (it is a live tc_work_t)"),
            "{}",
            as_pear.message
        );
        assert!(unsafe { take_handle(a, "a") }.unwrap().is_some());
        let twice = unsafe { take_handle(a, "a") }.unwrap_err();
        assert!(twice
            .message
            .contains("'a': handle is not a live tc_work_t"));
        let garbage = 0x5a5a_5a50usize as *const Apple;
        assert!(unsafe { handle_ref(garbage, "g") }.is_err());
        let null = unsafe { handle_ref(std::ptr::null::<Apple>(), "n") }.unwrap_err();
        assert_eq!(null.kind, ErrorKind::NullArgument);
        assert!(unsafe { take_handle(std::ptr::null_mut::<Apple>(), "n") }
            .unwrap()
            .is_none());
    }

    /// A thread's last live handle is remembered: freeing it (here or on
    /// another thread) must make the next check look again and refuse it.
    #[test]
    fn a_handle_found_live_and_then_freed_is_refused() {
        let a = into_handle(Apple(3));
        assert!(unsafe { handle_ref(a, "a") }.is_ok());
        assert!(unsafe { handle_ref(a, "a") }.is_ok(), "the remembered one");
        assert!(unsafe { take_handle(a, "a") }.unwrap().is_some());
        let e = unsafe { handle_ref(a, "a") }.unwrap_err();
        assert!(e.message.contains("not a live tc_work_t"), "{}", e.message);

        let b = into_handle(Apple(4));
        assert!(unsafe { handle_ref(b, "b") }.is_ok());
        let addr = b as usize;
        std::thread::spawn(move || unsafe { take_handle(addr as *mut Apple, "b") }.unwrap())
            .join()
            .unwrap();
        assert!(
            unsafe { handle_ref(b, "b") }.is_err(),
            "freed by another thread"
        );
        // Nor is a remembered handle taken for one of another type.
        let c = into_handle(Apple(5));
        assert!(unsafe { handle_ref(c, "c") }.is_ok());
        assert!(unsafe { handle_ref(c as *const Pear, "c") }.is_err());
        assert!(unsafe { take_handle(c, "c") }.unwrap().is_some());
    }

    #[test]
    fn a_freed_address_is_not_reused_by_the_next_handles() {
        let first = into_handle(Apple(7));
        unsafe { take_handle(first, "first") }.unwrap();
        let later: Vec<*mut Apple> = (0..QUARANTINE / 2)
            .map(|i| into_handle(Apple(i as u64)))
            .collect();
        assert!(!later.contains(&first));
        assert!(unsafe { take_handle(first, "first") }.is_err());
        for p in later {
            assert!(unsafe { take_handle(p, "later") }.unwrap().is_some());
        }
    }
}
