//! A thin, level-triggered `epoll(7)` wrapper for the store server: the
//! kernel keeps the interest list, so waiting costs nothing per idle
//! descriptor, and each event carries the 64-bit key of its connection.

use std::io::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub(super) const READABLE: u32 = libc::EPOLLIN as u32;
pub(super) const WRITABLE: u32 = libc::EPOLLOUT as u32;
/// Reported whether asked for or not: the peer is gone or the socket failed.
pub(super) const HANGUP: u32 = (libc::EPOLLHUP | libc::EPOLLERR) as u32;

pub(super) struct Epoll {
    fd: OwnedFd,
}

fn check(rc: libc::c_int) -> Result<libc::c_int> {
    if rc < 0 {
        Err(Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl Epoll {
    pub(super) fn new() -> Result<Epoll> {
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, key: u64) -> Result<()> {
        let mut ev = libc::epoll_event { events, u64: key };
        check(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) }).map(drop)
    }

    pub(super) fn add(&self, fd: RawFd, events: u32, key: u64) -> Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, key)
    }

    pub(super) fn modify(&self, fd: RawFd, events: u32, key: u64) -> Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, key)
    }

    /// Waits up to `timeout_ms` (-1: no limit) and fills `events`; returns how
    /// many were filled (0 after a timeout or a signal).
    pub(super) fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> Result<usize> {
        let cap = events.len().min(i32::MAX as usize) as libc::c_int;
        let rc =
            unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), cap, timeout_ms) };
        match check(rc) {
            Ok(n) => Ok(n as usize),
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
}
