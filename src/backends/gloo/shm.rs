//! Shared host memory for the gloo backend: `tc_mem_alloc` hands out
//! mappings of anonymous shared files (memfd), which the other processes of
//! the same host can map too. A window whose buffer lies in such memory is
//! mapped by its same-host peers at registration: their puts become memory
//! copies and `tc_window_map_remote` gives a real pointer to it.
//!
//! A peer maps the file through `/proc/<pid>/fd/<fd>` of its owner, and
//! checks that what it opened is the same file (device and inode), so a
//! process of another PID namespace or host is never mistaken for the
//! owner; anything that cannot be mapped falls back to messages.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn os_error(what: &str) -> Error {
    Error::system(what, std::io::Error::last_os_error())
}

fn file_id(fd: i32) -> std::io::Result<(u64, u64)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

impl SharedAllocations {
    /// `bytes` of zeroed memory that same-host peers can map.
    pub fn alloc(&self, bytes: usize, label: &str) -> Result<*mut c_void> {
        let name = std::ffi::CString::new(format!("torchcomm {label}")).unwrap_or_default();
        // SAFETY: a valid name; the result is checked.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_error("tc_mem_alloc: memfd_create"));
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let len = i64::try_from(bytes).map_err(|_| Error::invalid_argument(format!("argument 'bytes': {bytes} is too large")))?;
        // SAFETY: valid descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(os_error(&format!("tc_mem_alloc: sizing a shared file of {bytes} bytes")));
        }
        // SAFETY: maps the whole file; checked below.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(os_error(&format!("tc_mem_alloc: mapping {bytes} bytes")));
        }
        lock(&self.regions).insert(p as usize, Region { fd, len: bytes });
        Ok(p)
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
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path)?;
        if file_id(file.as_raw_fd())? != (at.dev, at.ino) {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{path} is not the peer's buffer (another PID namespace?)")));
        }
        let len = at.len as usize;
        // SAFETY: maps the whole file, of the length its owner gave it.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0) };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_place_map_free() {
        let a = SharedAllocations::default();
        let p = a.alloc(8192, "test").unwrap() as usize;
        assert!(a.placement(p + 100, 200).is_some_and(|x| x.offset == 100 && x.len == 8192));
        assert!(a.placement(p + 8000, 200).is_none(), "crosses the end");
        assert!(a.placement(p - 1, 2).is_none(), "starts before");
        let at = a.placement(p + 16, 64).unwrap();
        // This process maps its own allocation through /proc, as a peer would.
        let m = PeerMapping::map(&at).unwrap();
        unsafe { *m.ptr = 0x5a };
        assert_eq!(unsafe { *((p + 16) as *const u8) }, 0x5a, "the same memory");
        let wrong = Placement { ino: at.ino + 1, ..at };
        assert!(PeerMapping::map(&wrong).is_err(), "another file is refused");
        drop(m);
        a.free(p as *mut c_void, "test").unwrap();
        assert!(a.free(p as *mut c_void, "test").is_err());
        assert_eq!(a.leftovers(), 0);
    }
}
