//! Shared host memory for the gloo backend: `tc_mem_alloc` hands out
//! mappings of anonymous shared files (memfd), which the other processes of
//! the same host can map too. A window whose buffer lies in such memory is
//! mapped by its same-host peers at registration: their puts become memory
//! copies and `tc_window_map_remote` gives a real pointer to it.
//!
//! Each window also has a signal area: a shared word that every arrival
//! (a signal, a failure) bumps and that `wait_signal` sleeps on (a futex),
//! and one counter per origin rank, which same-host peers whose buffer
//! mapping succeeded increment directly: a signal between them is a memory
//! write and a wake-up instead of a message.
//!
//! A peer maps the file through `/proc/<pid>/fd/<fd>` of its owner, and
//! checks that what it opened is the same file (device and inode), so a
//! process of another PID namespace or host is never mistaken for the
//! owner; anything that cannot be mapped falls back to messages.

use crate::error::{Error, Result};
use crate::util::lock;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// One allocation: its file and mapping.
struct Region {
    fd: OwnedFd,
    len: usize,
}

/// The allocations of one comm, by start address.
#[derive(Default)]
pub struct SharedAllocations {
    regions: Mutex<BTreeMap<usize, Region>>,
}

/// Where a buffer lies in shared memory, as a peer needs it to map it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    pub pid: u64,
    pub fd: u64,
    /// Offset of the buffer in the allocation, and the allocation's length.
    pub offset: u64,
    pub len: u64,
    pub dev: u64,
    pub ino: u64,
}

fn os_error(what: &str) -> Error {
    Error::system(what, std::io::Error::last_os_error())
}

pub(super) fn file_id(fd: i32) -> std::io::Result<(u64, u64)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

/// A new anonymous shared file of `len` zeroed bytes (memfd) and its
/// mapping here: what `tc_mem_alloc`, window signal areas and the
/// intra-host segments are made of.
pub(super) fn shared_file(name: &str, len: usize) -> std::io::Result<(OwnedFd, *mut u8)> {
    let name = std::ffi::CString::new(format!("torchcomm {name}")).unwrap_or_default();
    // SAFETY: a valid name; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let size =
        i64::try_from(len).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: valid descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: maps the whole file; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok((fd, p as *mut u8))
}

impl SharedAllocations {
    /// `bytes` of zeroed memory that same-host peers can map.
    pub fn alloc(&self, bytes: usize, label: &str) -> Result<*mut c_void> {
        let (fd, p) = shared_file(label, bytes).map_err(|e| {
            Error::system(
                format!("tc_mem_alloc: a shared mapping of {bytes} bytes"),
                e,
            )
        })?;
        lock(&self.regions).insert(p as usize, Region { fd, len: bytes });
        Ok(p as *mut c_void)
    }

    /// Unmaps an allocation of [`SharedAllocations::alloc`]. Peers that
    /// mapped it keep their mapping until they deregister.
    pub fn free(&self, ptr: *mut c_void, label: &str) -> Result<()> {
        let region = lock(&self.regions).remove(&(ptr as usize)).ok_or_else(|| {
            Error::invalid_argument(format!("argument 'ptr': {ptr:p} was not allocated by tc_mem_alloc on {label} (or was freed already)"))
        })?;
        // SAFETY: the mapping made by alloc, no longer listed.
        if unsafe { libc::munmap(ptr, region.len) } != 0 {
            return Err(os_error("tc_mem_free: munmap"));
        }
        Ok(())
    }

    /// Where `[p, p + len)` lies, if inside one allocation.
    pub fn placement(&self, p: usize, len: usize) -> Option<Placement> {
        let regions = lock(&self.regions);
        let (start, region) = regions.range(..=p).next_back()?;
        let end = p.checked_add(len)?;
        if end > start + region.len {
            return None;
        }
        let (dev, ino) = file_id(region.fd.as_raw_fd()).ok()?;
        Some(Placement {
            pid: std::process::id() as u64,
            fd: region.fd.as_raw_fd() as u64,
            offset: (p - start) as u64,
            len: region.len as u64,
            dev,
            ino,
        })
    }

    /// Allocations still live (the comm is being destroyed).
    pub fn leftovers(&self) -> usize {
        lock(&self.regions).len()
    }
}

impl Drop for SharedAllocations {
    fn drop(&mut self) {
        // Memory the application did not free stays mapped: it may still
        // use it, and unmapping would turn that into a crash. Its files
        // close with the regions.
        let n = self.leftovers();
        if n > 0 {
            crate::log_warn!("gloo: {n} buffer(s) from tc_mem_alloc not freed before the comm was destroyed; they stay mapped");
        }
    }
}

/// This host, as the processes that may share memory see it (zeros when
/// unknown: then no memory is shared). Two processes are on the same host
/// when they agree on all of: the kernel's boot id, their network
/// namespace (the inode of `/proc/self/ns/net`) and their UTS hostname.
/// The boot id alone is not enough: network namespaces on one machine
/// (how containers and the netns tests make "hosts") share it, and share
/// /proc and /dev/shm too, so memory could be mapped across them while
/// the ranks behave as separate hosts everywhere else.
/// `TORCHCOMM_HOST_ID` overrides the rule: processes that set the same
/// non-empty value are one host (mapping a peer's memory is still
/// verified, so a wrong claim costs the shared-memory path, not results).
pub fn host_id() -> [u64; 2] {
    static ID: std::sync::OnceLock<[u64; 2]> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        let forced = std::env::var("TORCHCOMM_HOST_ID").unwrap_or_default();
        if !forced.trim().is_empty() {
            return identity_hash(&["override", forced.trim()]);
        }
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let boot = boot.trim();
        if boot.len() != 36 {
            return [0, 0];
        }
        let netns = std::fs::read_link("/proc/self/ns/net")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let uts = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        identity_hash(&[boot, &netns, uts.trim()])
    })
}

/// A 128-bit digest of `parts` (two FNV-1a passes with different seeds),
/// the same in every process and build: never zero.
fn identity_hash(parts: &[&str]) -> [u64; 2] {
    let fnv = |seed: u64| {
        let mut h = seed;
        for part in parts {
            for b in part.bytes().chain([0xff]) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        h.max(1)
    };
    [fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142)]
}

/// A peer's shared buffer mapped into this process.
pub struct PeerMapping {
    base: *mut c_void,
    len: usize,
    /// The peer's buffer inside the mapping.
    pub ptr: *mut u8,
}

// SAFETY: a plain mapping; access is synchronized by the window's protocol.
unsafe impl Send for PeerMapping {}
unsafe impl Sync for PeerMapping {}

impl PeerMapping {
    /// Maps the buffer `at` describes, owned by another process of this
    /// host; an error says why it cannot be (then puts travel as messages).
    pub fn map(at: &Placement) -> std::io::Result<PeerMapping> {
        let path = format!("/proc/{}/fd/{}", at.pid, at.fd);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        if file_id(file.as_raw_fd())? != (at.dev, at.ino) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{path} is not the peer's buffer (another PID namespace?)"),
            ));
        }
        let len = at.len as usize;
        // SAFETY: maps the whole file, of the length its owner gave it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the offset lies inside the mapping (the owner checked it).
        let ptr = unsafe { (base as *mut u8).add(at.offset as usize) };
        Ok(PeerMapping { base, len, ptr })
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `map`.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// A window's signal area (see the module docs): `[seq: u32, pad,
/// counters: u64 per rank]`, in a shared file when one can be made.
pub struct SignalArea {
    base: *mut c_void,
    len: usize,
    /// None when the area is private memory (no peer can map it).
    fd: Option<OwnedFd>,
    ranks: usize,
}

// SAFETY: the area is only accessed through atomics.
unsafe impl Send for SignalArea {}
unsafe impl Sync for SignalArea {}

fn area_len(ranks: usize) -> usize {
    8 + 8 * ranks
}

impl SignalArea {
    /// A zeroed area for `ranks` origins: shared when possible, else
    /// private (waits still work; peers signal by message).
    pub fn new(ranks: usize) -> Result<SignalArea> {
        let len = area_len(ranks);
        if let Ok((fd, base)) = shared_file("window signals", len) {
            return Ok(SignalArea {
                base: base as *mut c_void,
                len,
                fd: Some(fd),
                ranks,
            });
        }
        let flags = libc::MAP_SHARED | libc::MAP_ANONYMOUS;
        // SAFETY: maps `len` private bytes; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(os_error("mapping a window's signal area"));
        }
        Ok(SignalArea {
            base,
            len,
            fd: None,
            ranks,
        })
    }

    /// Where peers find the area (None when it is private).
    pub fn placement(&self) -> Option<Placement> {
        let fd = self.fd.as_ref()?;
        let (dev, ino) = file_id(fd.as_raw_fd()).ok()?;
        Some(Placement {
            pid: std::process::id() as u64,
            fd: fd.as_raw_fd() as u64,
            offset: 0,
            len: self.len as u64,
            dev,
            ino,
        })
    }

    fn seq(&self) -> &AtomicU32 {
        // SAFETY: the first word of a live, aligned mapping.
        unsafe { &*(self.base as *const AtomicU32) }
    }

    /// Signals received from `origin` by shared memory, ever (this epoch).
    pub fn counter(&self, origin: usize) -> &AtomicU64 {
        assert!(origin < self.ranks);
        // SAFETY: in bounds (checked), 8-aligned.
        unsafe { &*((self.base as *const u8).add(8 + 8 * origin) as *const AtomicU64) }
    }

    /// The arrival word's value, read before checking for what to wait for.
    pub fn arrivals(&self) -> u32 {
        self.seq().load(Ordering::Acquire)
    }

    /// Records an arrival and wakes this area's waiters.
    pub fn wake(&self) {
        self.seq().fetch_add(1, Ordering::Release);
        futex_wake(self.seq());
    }

    /// Sleeps until the arrival word differs from `seen` or `timeout`
    /// passed (or spuriously: callers re-check).
    pub fn wait(&self, seen: u32, timeout: Duration) {
        futex_wait(self.seq(), seen, timeout);
    }
}

impl Drop for SignalArea {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `new`.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// A peer's signal area mapped here: signalling it is an increment of this
/// rank's counter there, then a wake-up.
pub struct PeerSignals {
    mapping: PeerMapping,
    ranks: usize,
}

impl PeerSignals {
    pub fn map(at: &Placement, ranks: usize) -> std::io::Result<PeerSignals> {
        if at.len as usize != area_len(ranks) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the peer's signal area has another size",
            ));
        }
        Ok(PeerSignals {
            mapping: PeerMapping::map(at)?,
            ranks,
        })
    }

    /// One signal from `origin`, after everything this thread wrote before.
    pub fn signal(&self, origin: usize) {
        assert!(origin < self.ranks);
        let base = self.mapping.ptr;
        // SAFETY: in bounds and aligned (the size was checked at mapping).
        let (seq, counter) = unsafe {
            (
                &*(base as *const AtomicU32),
                &*(base.add(8 + 8 * origin) as *const AtomicU64),
            )
        };
        counter.fetch_add(1, Ordering::Release);
        seq.fetch_add(1, Ordering::Release);
        futex_wake(seq);
    }
}

/// Wakes every process sleeping on `word` (a shared futex: not PRIVATE).
pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: a valid, aligned word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            0,
            0,
        )
    };
}

pub(super) fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a valid, aligned word and timespec; returns at once when the
    // word no longer holds `seen`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
            0,
            0,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_place_map_free() {
        let a = SharedAllocations::default();
        let p = a.alloc(8192, "test").unwrap() as usize;
        assert!(a
            .placement(p + 100, 200)
            .is_some_and(|x| x.offset == 100 && x.len == 8192));
        assert!(a.placement(p + 8000, 200).is_none(), "crosses the end");
        assert!(a.placement(p - 1, 2).is_none(), "starts before");
        let at = a.placement(p + 16, 64).unwrap();
        // This process maps its own allocation through /proc, as a peer would.
        let m = PeerMapping::map(&at).unwrap();
        unsafe { *m.ptr = 0x5a };
        assert_eq!(unsafe { *((p + 16) as *const u8) }, 0x5a, "the same memory");
        let wrong = Placement {
            ino: at.ino + 1,
            ..at
        };
        assert!(PeerMapping::map(&wrong).is_err(), "another file is refused");
        drop(m);
        a.free(p as *mut c_void, "test").unwrap();
        assert!(a.free(p as *mut c_void, "test").is_err());
        assert_eq!(a.leftovers(), 0);
    }

    #[test]
    fn host_identity_is_stable_and_names_its_parts() {
        assert_ne!(host_id(), [0, 0], "this host has a boot id");
        assert_eq!(host_id(), host_id());
        let a = identity_hash(&["boot", "net:[1]", "h"]);
        assert_eq!(a, identity_hash(&["boot", "net:[1]", "h"]));
        assert_ne!(a, identity_hash(&["boot", "net:[2]", "h"]), "netns");
        assert_ne!(a, identity_hash(&["boot", "net:[1]", "g"]), "hostname");
        assert_ne!(a, identity_hash(&["boot", "net:[1", "]h"]), "separated");
    }

    #[test]
    fn signals_through_a_mapped_area_wake_the_waiter() {
        let area = std::sync::Arc::new(SignalArea::new(3).unwrap());
        let at = area.placement().expect("a shared area");
        let peer = PeerSignals::map(&at, 3).unwrap();
        assert!(
            PeerSignals::map(&at, 4).is_err(),
            "a size mismatch is refused"
        );
        let seen = area.arrivals();
        let waiter = {
            let area = area.clone();
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                while area.counter(2).load(Ordering::Acquire) == 0 {
                    area.wait(seen, Duration::from_secs(5));
                }
                t.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        peer.signal(2);
        let took = waiter.join().unwrap();
        assert!(
            took < Duration::from_secs(2),
            "woken by the signal, not the timeout: {took:?}"
        );
        assert_eq!(area.counter(2).load(Ordering::Acquire), 1);
        assert_eq!(area.counter(0).load(Ordering::Acquire), 0);
        // A wait whose word already moved returns at once.
        let t = std::time::Instant::now();
        area.wait(seen, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
