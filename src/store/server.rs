//! The TCPStore server: one thread running a level-triggered `epoll(7)`
//! event loop over non-blocking sockets, with the semantics of torch's libuv
//! server; a request costs the same with 0 or 8,192 idle connections open. A slow
//! or half-sent request only ever holds its own connection's buffer; a
//! malformed, oversized or unknown request closes that connection alone.

use crate::error::{Error, ErrorKind, Result};
use crate::store::conns::{Conn, ConnId, Conns};
use crate::store::epoll::{self, Epoll};
use crate::store::state::State;
use crate::store::wire::{self, Decode, Request};
use std::collections::HashSet;
use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Listen backlog: large enough for 1024 clients connecting at once.
const BACKLOG: i32 = 4096;
/// Bytes read from one connection per loop turn, so that one fast sender
/// cannot starve the others.
const READ_BUDGET: usize = 1 << 20;
/// Unsent reply bytes above which a connection's further requests wait
/// (torch's clients never have more than one reply outstanding).
const MAX_BACKLOG: usize = 16 << 20;
/// Default of [`ServerOptions::reply_timeout`].
const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// How a [`TcpStoreServer`] is started.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// The address whose interface(s) to listen on (every address it
    /// resolves to); None: every interface.
    pub bind: Option<String>,
    /// 0: a free port.
    pub port: u16,
    /// When set, a connection must present it (AUTH right after VALIDATE)
    /// before any other request; torch's clients cannot, so off by default.
    pub token: Option<Vec<u8>>,
    /// A client whose unread replies exceed the backlog limit and that reads
    /// nothing for this long is dropped. None: `TORCHCOMM_STORE_REPLY_TIMEOUT`
    /// (seconds), else 60 s.
    pub reply_timeout: Option<Duration>,
}

/// The token from `TORCHCOMM_STORE_TOKEN`, when set and not empty.
pub fn token_from_env() -> Option<Vec<u8>> {
    std::env::var_os("TORCHCOMM_STORE_TOKEN")
        .map(std::os::unix::ffi::OsStringExt::into_vec)
        .filter(|t| !t.is_empty())
}

fn reply_timeout_from_env() -> Duration {
    std::env::var("TORCHCOMM_STORE_REPLY_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0 && s.is_finite())
        .map_or(DEFAULT_REPLY_TIMEOUT, Duration::from_secs_f64)
}

/// Raises this process's soft limit on open files to the hard limit.
pub fn raise_nofile_limit() {
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// A running store server; dropping it (or [`TcpStoreServer::shutdown`])
/// stops the loop and closes every connection, waking parked clients with
/// an end of stream.
pub struct TcpStoreServer {
    port: u16,
    wake: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

fn prepare(listener: TcpListener) -> std::io::Result<TcpListener> {
    // A second listen() on Linux only resizes the backlog.
    unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) };
    listener.set_nonblocking(true)?;
    Ok(listener)
}

fn bind_everywhere(port: u16) -> std::io::Result<Vec<TcpListener>> {
    // Dual-stack first (IPv4 clients arrive v4-mapped), then IPv4 only.
    let listener = match TcpListener::bind(("::", port)) {
        Ok(l) => l,
        Err(e) if e.kind() == IoKind::AddrInUse => return Err(e),
        Err(_) => TcpListener::bind(("0.0.0.0", port))?,
    };
    Ok(vec![prepare(listener)?])
}

/// Listens on every address `host` resolves to that belongs to this machine
/// (one port for all); every interface, with a warning, when none does.
fn bind_host(host: &str, port: u16) -> std::io::Result<Vec<TcpListener>> {
    let mut addrs: Vec<IpAddr> = (host, 0).to_socket_addrs()?.map(|a| a.ip()).collect();
    addrs.dedup();
    let mut listeners: Vec<TcpListener> = Vec::new();
    for ip in addrs {
        let port = listeners
            .first()
            .and_then(|l| l.local_addr().ok())
            .map_or(port, |a| a.port());
        match TcpListener::bind(SocketAddr::new(ip, port)) {
            Ok(l) => listeners.push(prepare(l)?),
            Err(e) if e.kind() == IoKind::AddrInUse => return Err(e),
            // Not an address of this machine (or no IPv6): skip it.
            Err(_) => {}
        }
    }
    if listeners.is_empty() {
        crate::log_warn!(
            "store server: {host} is not an address of this machine; listening on every interface"
        );
        return bind_everywhere(port);
    }
    Ok(listeners)
}

impl TcpStoreServer {
    /// Starts a server on every local address at `port` (0: a free port),
    /// without a token.
    pub fn start(port: u16) -> Result<TcpStoreServer> {
        TcpStoreServer::start_with(&ServerOptions {
            port,
            ..ServerOptions::default()
        })
    }

    /// Starts a server as `opts` says.
    pub fn start_with(opts: &ServerOptions) -> Result<TcpStoreServer> {
        raise_nofile_limit();
        let port = opts.port;
        let bound = match &opts.bind {
            Some(host) => bind_host(host, port),
            None => bind_everywhere(port),
        };
        let listeners = bound.map_err(|e| {
            if e.kind() == IoKind::AddrInUse {
                Error::new(
                    ErrorKind::System,
                    format!("cannot start the store server on port {port}: address already in use"),
                )
            } else {
                Error::system(format!("cannot start the store server on port {port}"), e)
            }
        })?;
        let local: Vec<SocketAddr> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let port = local
            .first()
            .ok_or_else(|| Error::internal("store server: no listening address"))?
            .port();
        let mut fds = [0 as RawFd; 2];
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(Error::system(
                "store server: pipe",
                std::io::Error::last_os_error(),
            ));
        }
        let (wake_r, wake_w) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let policy = Policy {
            token: opts.token.clone(),
            reply_timeout: opts.reply_timeout.unwrap_or_else(reply_timeout_from_env),
        };
        let event_loop = EventLoop::new(listeners, wake_r, policy)
            .map_err(|e| Error::system("store server: epoll", e))?;
        let thread = std::thread::Builder::new()
            .name("tc-store-server".into())
            .spawn(move || event_loop.run())
            .map_err(|e| Error::system("store server: spawning its thread", e))?;
        crate::log_info!(
            "store server listening on {local:?}{}",
            if opts.token.is_some() {
                " (token required)"
            } else {
                ""
            }
        );
        Ok(TcpStoreServer {
            port,
            wake: Some(wake_w),
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server and waits for its thread; idempotent.
    pub fn shutdown(&mut self) {
        if let Some(w) = self.wake.take() {
            unsafe { libc::write(w.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
            // Keep the write end open until the loop saw the byte.
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
            drop(w);
        }
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What the event loop enforces.
struct Policy {
    token: Option<Vec<u8>>,
    reply_timeout: Duration,
}

/// Compares without an early exit, so timing does not reveal a prefix.
fn same_token(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// epoll keys of the wake pipe and the listeners, above every connection's.
const WAKE_KEY: u64 = u64::MAX;
const LISTENER_KEYS: u64 = u64::MAX - 1;
/// Events taken from the kernel per wait.
const EVENT_BATCH: usize = 256;

struct EventLoop {
    epoll: Epoll,
    listeners: Vec<TcpListener>,
    /// The wake pipe's read end; only epoll looks at it, but the loop owns it.
    _wake: OwnedFd,
    conns: Conns,
    /// Connections over the backlog limit, checked for the reply timeout.
    stalled: HashSet<ConnId>,
    state: State,
    policy: Policy,
}

impl EventLoop {
    fn new(listeners: Vec<TcpListener>, wake: OwnedFd, policy: Policy) -> std::io::Result<Self> {
        let epoll = Epoll::new()?;
        epoll.add(wake.as_raw_fd(), epoll::READABLE, WAKE_KEY)?;
        for (i, l) in listeners.iter().enumerate() {
            epoll.add(l.as_raw_fd(), epoll::READABLE, LISTENER_KEYS - i as u64)?;
        }
        Ok(EventLoop {
            epoll,
            listeners,
            _wake: wake,
            conns: Conns::default(),
            stalled: HashSet::new(),
            state: State::default(),
            policy,
        })
    }

    /// Each turn costs the events that arrived plus the connections they
    /// gave work to, never a pass over every connection.
    fn run(mut self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENT_BATCH];
        loop {
            let wait_ms = if self.stalled.is_empty() { -1 } else { 500 };
            let n = match self.epoll.wait(&mut events, wait_ms) {
                Ok(n) => n,
                Err(e) => {
                    crate::log_warn!("store server: epoll_wait failed: {e}; stopping");
                    return;
                }
            };
            for ev in &events[..n] {
                let (key, flags) = (ev.u64, ev.events);
                if key == WAKE_KEY {
                    crate::log_info!(
                        "store server: shutting down with {} connections",
                        self.conns.len()
                    );
                    return;
                }
                if key > LISTENER_KEYS - self.listeners.len() as u64 {
                    self.accept_all((LISTENER_KEYS - key) as usize);
                } else {
                    self.on_event(key, flags);
                }
            }
            self.settle();
            if !self.stalled.is_empty() {
                self.drop_stalled();
            }
        }
    }

    fn on_event(&mut self, id: ConnId, flags: u32) {
        if flags & (epoll::READABLE | epoll::HANGUP) != 0 {
            self.read_conn(id);
        }
        // Writable, or read: its replies, eof and interest are settled at
        // the end of the turn.
        self.conns.mark(id);
    }

    /// Flushes every connection given output or events this turn, serves
    /// requests that waited for a backlog to drain, and updates what each
    /// is polled for.
    fn settle(&mut self) {
        loop {
            let pending = self.conns.take_dirty();
            if pending.is_empty() {
                return;
            }
            for id in pending {
                self.flush(id);
                let resume = self
                    .conns
                    .get(id)
                    .is_some_and(|c| !c.inbuf.is_empty() && c.backlog() <= MAX_BACKLOG);
                if resume {
                    self.process(id);
                    self.flush(id);
                }
                self.update_interest(id);
            }
        }
    }

    /// Reads while the client is under its backlog limit (back-pressure),
    /// waits for room while it has output.
    fn update_interest(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(id) else {
            self.stalled.remove(&id);
            return;
        };
        let backlog = c.backlog();
        let mut want = 0;
        if !c.eof && backlog <= MAX_BACKLOG {
            want |= epoll::READABLE;
        }
        if backlog > 0 {
            want |= epoll::WRITABLE;
        }
        if backlog > MAX_BACKLOG {
            self.stalled.insert(id);
        } else {
            self.stalled.remove(&id);
        }
        if want != c.interest {
            if let Err(e) = self.epoll.modify(c.stream.as_raw_fd(), want, id) {
                let reason = format!("epoll_ctl failed: {e}");
                self.close(id, Some(&reason));
                return;
            }
            c.interest = want;
        }
    }

    /// Drops clients that leave a full backlog unread for the reply timeout.
    fn drop_stalled(&mut self) {
        let limit = self.policy.reply_timeout;
        let stalled: Vec<(ConnId, usize)> = self
            .stalled
            .iter()
            .filter_map(|id| self.conns.get(*id).map(|c| (*id, c)))
            .filter(|(_, c)| c.backlog() > MAX_BACKLOG && c.last_drain.elapsed() >= limit)
            .map(|(id, c)| (id, c.backlog()))
            .collect();
        for (id, backlog) in stalled {
            let reason = format!(
                "it left {backlog} bytes of replies unread for {:.1} s (limit {} bytes)",
                limit.as_secs_f64(),
                MAX_BACKLOG
            );
            self.close(id, Some(&reason));
        }
    }

    fn accept_all(&mut self, listener: usize) {
        loop {
            match self.listeners[listener].accept() {
                Ok((stream, addr)) => {
                    let authorized = self.policy.token.is_none();
                    let epoll = &self.epoll;
                    let added = self.conns.insert_with(|id| {
                        stream.set_nonblocking(true)?;
                        let _ = stream.set_nodelay(true);
                        epoll.add(stream.as_raw_fd(), epoll::READABLE, id)?;
                        Ok::<_, std::io::Error>(Conn::new(
                            stream,
                            addr.to_string(),
                            authorized,
                            epoll::READABLE,
                        ))
                    });
                    if let Err(e) = added {
                        crate::log_warn!(
                            "store server: cannot serve a connection from {addr}: {e}"
                        );
                    }
                }
                Err(e) if e.kind() == IoKind::WouldBlock => return,
                Err(e)
                    if e.kind() == IoKind::Interrupted || e.kind() == IoKind::ConnectionAborted =>
                {
                    continue
                }
                Err(e) => {
                    // Out of descriptors: back off instead of spinning.
                    crate::log_warn!("store server: accept failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    return;
                }
            }
        }
    }

    fn close(&mut self, id: ConnId, reason: Option<&str>) {
        if let (Some(r), Some(c)) = (reason, self.conns.get(id)) {
            crate::log_warn!("store server: closing connection from {}: {r}", c.peer);
        }
        self.state.cancel_conn(&mut self.conns, id);
        self.stalled.remove(&id);
        // Closing the socket also takes it out of the epoll set.
        self.conns.remove(id);
    }

    fn read_conn(&mut self, id: ConnId) {
        let mut chunk = [0u8; 64 * 1024];
        let mut budget = READ_BUDGET;
        {
            let Some(c) = self.conns.get_mut(id) else {
                return;
            };
            if c.backlog() > MAX_BACKLOG {
                // Only a hang-up or error wakes a connection not polled for
                // input: a client gone with replies unread.
                let reason = format!("it hung up with {} bytes of replies unread", c.backlog());
                self.close(id, Some(&reason));
                return;
            }
            while budget > 0 {
                match c.stream.read(&mut chunk) {
                    Ok(0) => {
                        c.eof = true;
                        break;
                    }
                    Ok(n) => {
                        c.inbuf.extend_from_slice(&chunk[..n]);
                        budget = budget.saturating_sub(n);
                    }
                    Err(e) if e.kind() == IoKind::WouldBlock => break,
                    Err(e) if e.kind() == IoKind::Interrupted => continue,
                    Err(_) => {
                        // Reset by peer: nothing more to say to it.
                        c.eof = true;
                        c.out.clear();
                        c.out_pos = 0;
                        break;
                    }
                }
            }
        }
        self.process(id);
    }

    fn process(&mut self, id: ConnId) {
        let mut pos = 0;
        let mut inbuf = match self.conns.get_mut(id) {
            Some(c) => std::mem::take(&mut c.inbuf),
            None => return,
        };
        let mut failure = None;
        while pos < inbuf.len() {
            let Some(c) = self.conns.get(id) else {
                return;
            };
            let (validated, authorized) = (c.validated, c.authorized);
            if c.backlog() > MAX_BACKLOG {
                break;
            }
            if !validated && inbuf[pos] != wire::VALIDATE {
                failure = Some(format!(
                    "first message has query code {}, not VALIDATE",
                    inbuf[pos]
                ));
                break;
            }
            if validated && !authorized && inbuf[pos] != wire::AUTH {
                failure = Some(format!(
                    "refused: it sent query code {} without presenting the store token \
                     (TORCHCOMM_STORE_TOKEN)",
                    inbuf[pos]
                ));
                break;
            }
            match wire::decode_request(&inbuf[pos..]) {
                Ok((req, used)) => {
                    pos += used;
                    if let Err(e) = self.admit(id, &req) {
                        failure = Some(e);
                        break;
                    }
                    if let Err(e) = self.state.handle(&mut self.conns, id, req) {
                        failure = Some(e);
                        break;
                    }
                }
                Err(Decode::Incomplete) => break,
                Err(Decode::Malformed(e)) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if let Some(reason) = failure {
            self.close(id, Some(&reason));
            return;
        }
        inbuf.drain(..pos);
        if let Some(c) = self.conns.get_mut(id) {
            if c.eof && !inbuf.is_empty() && c.backlog() <= MAX_BACKLOG {
                let reason = format!(
                    "connection closed in the middle of a request ({} bytes pending)",
                    inbuf.len()
                );
                self.close(id, Some(&reason));
                return;
            }
            c.inbuf = inbuf;
        }
    }

    /// Marks the handshake steps as done; refuses a wrong token.
    fn admit(&mut self, id: ConnId, req: &Request) -> std::result::Result<(), String> {
        let Some(c) = self.conns.get_mut(id) else {
            return Ok(());
        };
        match req {
            Request::Validate(_) => c.validated = true,
            Request::Auth(token) => {
                if let Some(want) = &self.policy.token {
                    if !same_token(token, want) {
                        return Err("refused: it presented a wrong store token".into());
                    }
                }
                c.authorized = true;
            }
            _ => {}
        }
        Ok(())
    }

    fn flush(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        while c.out_pos < c.out.len() {
            match c.stream.write(&c.out[c.out_pos..]) {
                Ok(0) => break,
                Ok(n) => {
                    c.out_pos += n;
                    c.last_drain = Instant::now();
                }
                Err(e) if e.kind() == IoKind::WouldBlock => break,
                Err(e) if e.kind() == IoKind::Interrupted => continue,
                Err(_) => {
                    self.close(id, None);
                    return;
                }
            }
        }
        if c.out_pos == c.out.len() {
            c.out.clear();
            c.out_pos = 0;
            c.last_drain = Instant::now();
            if c.eof {
                self.close(id, None);
            }
        } else if c.out_pos > (1 << 20) {
            c.out.drain(..c.out_pos);
            c.out_pos = 0;
        }
    }
}
