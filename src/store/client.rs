//! The TCPStore client: torch's handshake (VALIDATE, then PING with the pid),
//! connect retries with backoff, WAIT before GET, CANCEL_WAIT after a local
//! wait timeout, and `/` in front of every user key.

use crate::error::{Error, ErrorKind, Result};
use crate::store::server::{token_from_env, ServerOptions, TcpStoreServer};
use crate::store::wire::{self, ReplyReader, Request};
use crate::store::Store;
use std::io::{ErrorKind as IoKind, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the immediate retry of a request whose connection was lost may
/// take to connect again: a server that exited fails the call quickly.
const RETRY_CONNECT: Duration = Duration::from_secs(2);

/// The raw key every process ADDs to when waiting for workers.
pub const INIT_KEY: &str = "init/";

/// How a [`TcpStore`] is created.
#[derive(Debug, Clone)]
pub struct TcpStoreOptions {
    /// The server's address; with `is_server`, also the address whose
    /// interface(s) the hosted server listens on ("" : every interface,
    /// reached through 127.0.0.1).
    pub host: String,
    /// 0 with `is_server`: a free port.
    pub port: u16,
    /// Host a server in this process (and connect to it).
    pub is_server: bool,
    /// Known number of processes; with `wait_for_workers`, each sends the
    /// `init/` ADD and the server host waits for all of them.
    pub world_size: Option<u32>,
    pub wait_for_workers: bool,
    pub timeout: Duration,
    /// Shared secret presented on connecting and, with `is_server`, required
    /// from every client (see `ServerOptions::token`). The constructors take
    /// it from `TORCHCOMM_STORE_TOKEN`.
    pub token: Option<Vec<u8>>,
}

impl TcpStoreOptions {
    pub fn client(host: &str, port: u16, timeout: Duration) -> TcpStoreOptions {
        TcpStoreOptions {
            host: host.into(),
            port,
            is_server: false,
            world_size: None,
            wait_for_workers: true,
            timeout,
            token: token_from_env(),
        }
    }
    /// A server on the loopback interface only.
    pub fn server(port: u16, timeout: Duration) -> TcpStoreOptions {
        TcpStoreOptions {
            host: "127.0.0.1".into(),
            is_server: true,
            ..TcpStoreOptions::client("127.0.0.1", port, timeout)
        }
    }
}

struct Conn {
    /// None after a failure left the stream in an unknown state: the next
    /// request connects again.
    stream: Option<TcpStream>,
    /// Why the last connection was lost, for the next messages.
    lost: Option<String>,
}

/// A TCPStore client connection (optionally owning the server it hosts).
/// Thread-safe: requests on one connection are serialized, as in torch.
/// A lost connection is made again on the next request; requests that may
/// safely run twice are retried once on a new connection.
pub struct TcpStore {
    host: String,
    port: u16,
    timeout: Duration,
    token: Option<Vec<u8>>,
    conn: Mutex<Conn>,
    server: Option<Arc<TcpStoreServer>>,
}

fn user_key(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(b'/');
    k.extend_from_slice(key.as_bytes());
    k
}

/// Refuses a key or value beyond the server's limits before anything is
/// copied or sent.
fn check_args(keys: &[&str], values: &[usize]) -> Result<()> {
    wire::check_count(keys.len()).map_err(|e| Error::invalid_argument(format!("keys: {e}")))?;
    for k in keys {
        // +1: the leading '/' on the wire.
        if k.len() + 1 > wire::MAX_KEY_LEN {
            wire::check_key(&user_key(k))
                .map_err(|e| Error::invalid_argument(format!("argument 'key': {e}")))?;
        }
    }
    for v in values {
        wire::check_value(*v)
            .map_err(|e| Error::invalid_argument(format!("argument 'value': {e}")))?;
    }
    Ok(())
}

fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    let mut addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    // IPv6 first, as torch tries it.
    addrs.sort_by_key(|a| !a.is_ipv6());
    Ok(addrs)
}

fn connect_with_retry(host: &str, port: u16, timeout: Duration) -> Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(10);
    let mut last: Option<std::io::Error> = None;
    loop {
        match resolve(host, port) {
            Ok(addrs) => {
                for a in &addrs {
                    let left = deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(10));
                    match TcpStream::connect_timeout(a, left.min(Duration::from_secs(30))) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = Some(e),
                    }
                }
            }
            Err(e) => last = Some(e),
        }
        let now = Instant::now();
        if now >= deadline {
            let why = last.map_or_else(|| "no address".to_string(), |e| e.to_string());
            return Err(Error::timeout(format!(
                "cannot connect to the store at {host}:{port} within {}ms: {why}",
                timeout.as_millis()
            )));
        }
        std::thread::sleep(backoff.min(deadline - now));
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

fn is_lost(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        IoKind::UnexpectedEof
            | IoKind::ConnectionReset
            | IoKind::ConnectionAborted
            | IoKind::BrokenPipe
    )
}

fn io_err(host: &str, port: u16, what: &str, e: std::io::Error) -> Error {
    let kind = match e.kind() {
        IoKind::WouldBlock | IoKind::TimedOut => ErrorKind::Timeout,
        _ if is_lost(&e) => ErrorKind::Remote,
        _ => ErrorKind::System,
    };
    let detail = if is_lost(&e) {
        // torch's protocol has no error reply: a server that refuses a
        // request closes the connection, so say what usually causes that.
        "the server closed the connection (a store server closes it on a request it \
         refuses: ADD or BARRIER on a value that is not a decimal integer, an ADD past \
         int64, a key, value or reply beyond its limits, or a wrong or missing store \
         token; or the server exited)"
            .to_string()
    } else {
        e.to_string()
    };
    Error::new(kind, format!("store {host}:{port}: {what}: {detail}"))
}

fn wait_timeout_error(timeout: Duration, keys: &[Vec<u8>]) -> Error {
    let keys: Vec<String> = keys
        .iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    Error::timeout(format!(
        "wait timeout after {}ms, keys: {}",
        timeout.as_millis(),
        keys.join(", ")
    ))
}

/// The loss that made a retry necessary, with why connecting again failed.
fn reconnect_failed(lost: &Error, e: &Error) -> Error {
    Error::new(
        lost.kind,
        format!("{}; connecting again failed: {}", lost.message, e.message),
    )
}

/// What to call a request in messages: its name and first key.
fn describe(req: &Request) -> String {
    match req.first_key() {
        Some(k) => format!(
            "{} on key {:?}",
            req.name(),
            String::from_utf8_lossy(&k[..k.len().min(200)])
        ),
        None => req.name().to_string(),
    }
}

/// Whether sending a request twice leaves the store and the reply as once.
fn idempotent(req: &Request) -> bool {
    matches!(
        req,
        Request::Set { .. }
            | Request::MultiSet(_)
            | Request::Get(_)
            | Request::MultiGet(_)
            | Request::Check(_)
            | Request::GetNumKeys
            | Request::QueueLen(_)
            | Request::ListKeys
            | Request::Ping(_)
    )
}

/// Requests without a reply in torch's protocol: a PING sent behind them
/// proves the server took them (it answers in order, and closes the
/// connection on a request it refuses).
fn needs_ack(req: &Request) -> bool {
    matches!(
        req,
        Request::Set { .. }
            | Request::Append { .. }
            | Request::MultiSet(_)
            | Request::QueuePush { .. }
    )
}

impl TcpStore {
    /// Connects (hosting the server first when `is_server`), performs the
    /// handshake, then waits for workers when asked to.
    pub fn new(opts: &TcpStoreOptions) -> Result<TcpStore> {
        let server = if opts.is_server {
            let bind = (!opts.host.is_empty()).then(|| opts.host.clone());
            Some(Arc::new(TcpStoreServer::start_with(&ServerOptions {
                bind,
                port: opts.port,
                token: opts.token.clone(),
                reply_timeout: None,
            })?))
        } else {
            None
        };
        TcpStore::with_server(opts, server)
    }

    /// Connects to `server` (hosted by this process, shared) or, when None,
    /// to `opts.host:opts.port`; `opts.is_server` only says whether this
    /// process waits for the workers to join.
    pub fn with_server(
        opts: &TcpStoreOptions,
        server: Option<Arc<TcpStoreServer>>,
    ) -> Result<TcpStore> {
        if opts.world_size == Some(0) {
            return Err(Error::invalid_argument(
                "world_size must be positive (or unknown), not 0",
            ));
        }
        let port = server.as_ref().map_or(opts.port, |s| s.port());
        let host = if server.is_some() && opts.host.is_empty() {
            "127.0.0.1".to_string()
        } else {
            opts.host.clone()
        };
        let store = TcpStore {
            host,
            port,
            timeout: opts.timeout,
            token: opts.token.clone(),
            conn: Mutex::new(Conn {
                stream: None,
                lost: None,
            }),
            server,
        };
        let stream = store.handshake(store.timeout)?;
        store.lock().stream = Some(stream);
        if let (Some(n), true) = (opts.world_size, opts.wait_for_workers) {
            store.wait_for_workers(n, opts.is_server)?;
        }
        Ok(store)
    }

    /// A new connection with torch's handshake: VALIDATE, our AUTH when a
    /// token is set, then PING with the pid, whose echo proves the server
    /// accepted what came before.
    fn handshake(&self, connect_within: Duration) -> Result<TcpStream> {
        let (host, port) = (&self.host[..], self.port);
        let mut stream = connect_with_retry(host, port, connect_within)?;
        stream
            .set_nodelay(true)
            .map_err(|e| io_err(host, port, "TCP_NODELAY", e))?;
        stream
            .set_read_timeout(Some(self.timeout.max(Duration::from_millis(1))))
            .map_err(|e| io_err(host, port, "timeout", e))?;
        let nonce = std::process::id();
        let mut hello = Request::Validate(wire::VALIDATION_MAGIC).to_bytes();
        if let Some(t) = &self.token {
            Request::Auth(t.clone()).encode(&mut hello);
        }
        Request::Ping(nonce).encode(&mut hello);
        stream
            .write_all(&hello)
            .map_err(|e| io_err(host, port, "handshake", e))?;
        let echo = ReplyReader { inner: &mut stream }.u32().map_err(|e| {
            let mut err = io_err(host, port, "PING reply", e);
            if self.token.is_some() {
                err.message += " -- this client presented a store token: the server may \
                    require another one, or be torch's, which takes none";
            }
            err
        })?;
        if echo != nonce {
            return Err(Error::remote(format!(
                "store {host}:{port}: PING returned {echo:#x}, expected {nonce:#x}"
            )));
        }
        Ok(stream)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Conn> {
        crate::util::lock(&self.conn)
    }

    /// A second connection to the same server (torch's `clone`); it shares
    /// ownership of a hosted server.
    pub fn clone_store(&self) -> Result<TcpStore> {
        let store = TcpStore {
            host: self.host.clone(),
            port: self.port,
            timeout: self.timeout,
            token: self.token.clone(),
            conn: Mutex::new(Conn {
                stream: None,
                lost: None,
            }),
            server: self.server.clone(),
        };
        let stream = store.handshake(store.timeout)?;
        store.lock().stream = Some(stream);
        Ok(store)
    }

    pub fn host(&self) -> &str {
        &self.host
    }
    pub fn port(&self) -> u16 {
        self.port
    }

    fn wait_for_workers(&self, world_size: u32, is_server: bool) -> Result<()> {
        let key = INIT_KEY.as_bytes().to_vec();
        let mut joined = self.add_raw(&key, 1)?;
        if !is_server {
            return Ok(());
        }
        let start = Instant::now();
        while joined < world_size as i64 {
            if start.elapsed() >= self.timeout {
                return Err(Error::timeout(format!(
                    "Timed out after {} seconds waiting for clients. {joined}/{world_size} clients joined.",
                    self.timeout.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
            joined = self.add_raw(&key, 0)?;
        }
        Ok(())
    }

    /// The connection's stream, connecting again (within the store timeout)
    /// after a loss.
    fn stream<'a>(&self, conn: &'a mut Conn) -> Result<&'a mut TcpStream> {
        self.stream_within(conn, self.timeout)
    }

    fn stream_within<'a>(&self, conn: &'a mut Conn, within: Duration) -> Result<&'a mut TcpStream> {
        if conn.stream.is_none() {
            let stream = self.handshake(within).map_err(|e| match &conn.lost {
                Some(why) => e.context(format!("reconnecting after: {why}")),
                None => e,
            })?;
            conn.stream = Some(stream);
            conn.lost = None;
        }
        Ok(conn.stream.as_mut().expect("connected above"))
    }

    /// Sends `req` and reads its reply with `read`, holding the connection.
    /// Limits are checked first; a lost connection is made again, and an
    /// idempotent request retried once on it.
    fn call<T>(
        &self,
        req: &Request,
        read: impl Fn(&mut ReplyReader<TcpStream>) -> std::io::Result<T>,
    ) -> Result<T> {
        wire::check_limits(req).map_err(Error::invalid_argument)?;
        let mut conn = self.lock();
        let mut bytes = req.to_bytes();
        let nonce = std::process::id();
        if needs_ack(req) {
            Request::Ping(nonce).encode(&mut bytes);
        }
        let mut retry_after: Option<Error> = None;
        loop {
            let stream = match &retry_after {
                None => self.stream(&mut conn)?,
                Some(lost) => self
                    .stream_within(&mut conn, RETRY_CONNECT)
                    .map_err(|e| reconnect_failed(lost, &e))?,
            };
            let res = stream.write_all(&bytes).and_then(|_| {
                let mut r = ReplyReader { inner: stream };
                let v = read(&mut r)?;
                if needs_ack(req) && r.u32()? != nonce {
                    return Err(std::io::Error::new(
                        IoKind::InvalidData,
                        "the PING after it returned another nonce",
                    ));
                }
                Ok(v)
            });
            match res {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let retry = retry_after.is_none() && idempotent(req) && is_lost(&e);
                    let err = io_err(&self.host, self.port, &describe(req), e);
                    conn.stream = None;
                    conn.lost = Some(err.message.clone());
                    if !retry {
                        return Err(err);
                    }
                    crate::log_warn!("{}; connecting again to retry it", err.message);
                    retry_after = Some(err);
                }
            }
        }
    }

    fn add_raw(&self, key: &[u8], delta: i64) -> Result<i64> {
        self.call(
            &Request::Add {
                key: key.to_vec(),
                delta,
            },
            |r| r.i64(),
        )
    }

    /// WAIT on wire keys; on a local timeout sends CANCEL_WAIT as torch does
    /// and keeps the connection usable. A lost connection is made again and
    /// the wait sent once more.
    fn wait_raw(&self, keys: Vec<Vec<u8>>, timeout: Duration) -> Result<()> {
        let req = Request::Wait(keys);
        wire::check_limits(&req).map_err(Error::invalid_argument)?;
        let mut guard = self.lock();
        let deadline = Instant::now() + timeout;
        let mut lost: Option<Error> = None;
        for attempt in 0..2 {
            let left = match attempt {
                0 => timeout,
                _ => deadline.saturating_duration_since(Instant::now()),
            };
            if attempt == 1 {
                if let Err(e) = self.stream_within(&mut guard, RETRY_CONNECT) {
                    return Err(reconnect_failed(
                        lost.as_ref().expect("set on the first attempt"),
                        &e,
                    ));
                }
            }
            match self.wait_once(&mut guard, &req, left, timeout) {
                Err(e) if attempt == 0 && e.kind == ErrorKind::Remote && guard.stream.is_none() => {
                    crate::log_warn!("{}; connecting again to retry it", e.message);
                    lost = Some(e);
                }
                other => return other,
            }
        }
        unreachable!("the second attempt returns")
    }

    /// One WAIT bounded by `timeout`; a timeout is reported as `reported`.
    fn wait_once(
        &self,
        conn: &mut Conn,
        req: &Request,
        timeout: Duration,
        reported: Duration,
    ) -> Result<()> {
        let Request::Wait(keys) = req else {
            unreachable!("wait_once takes a WAIT")
        };
        let stream = self.stream(conn)?;
        let fail = |conn: &mut Conn, what: &str, e: std::io::Error| {
            let err = io_err(&self.host, self.port, what, e);
            conn.stream = None;
            conn.lost = Some(err.message.clone());
            err
        };
        if let Err(e) = stream.write_all(&req.to_bytes()) {
            return Err(fail(conn, &describe(req), e));
        }
        let _ = stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1))));
        let first = ReplyReader { inner: stream }.u8();
        let _ = stream.set_read_timeout(Some(self.timeout.max(Duration::from_millis(1))));
        match first {
            Ok(wire::STOP_WAITING) => Ok(()),
            Ok(other) => Err(fail(
                conn,
                &describe(req),
                std::io::Error::new(
                    IoKind::InvalidData,
                    format!("unexpected WAIT reply {other}"),
                ),
            )),
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => {
                // Cancel; a STOP_WAITING that raced with us comes first.
                let res = stream
                    .write_all(&Request::CancelWait.to_bytes())
                    .and_then(|_| {
                        let mut r = ReplyReader { inner: stream };
                        let mut b = r.u8()?;
                        if b == wire::STOP_WAITING {
                            b = r.u8()?;
                        }
                        if b != wire::WAIT_CANCELED {
                            return Err(std::io::Error::new(
                                IoKind::InvalidData,
                                format!("CANCEL_WAIT answered {b}"),
                            ));
                        }
                        Ok(())
                    });
                if let Err(e) = res {
                    fail(conn, "CANCEL_WAIT", e);
                }
                Err(wait_timeout_error(reported, keys))
            }
            Err(e) => Err(fail(conn, &describe(req), e)),
        }
    }

    /// APPEND: adds `value` to the end of `key`'s value (creating it).
    pub fn append_bytes(&self, key: &str, value: &[u8]) -> Result<()> {
        check_args(&[key], &[value.len()])?;
        self.call(
            &Request::Append {
                key: user_key(key),
                value: value.to_vec(),
            },
            |_| Ok(()),
        )
    }

    pub fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        check_args(&[key], &[value.len()])?;
        self.call(
            &Request::QueuePush {
                key: user_key(key),
                value: value.to_vec(),
            },
            |_| Ok(()),
        )
    }

    /// Pops the oldest value of queue `key`; `block`: wait for one first
    /// (up to the store timeout), else `None` when it is empty.
    pub fn queue_pop(&self, key: &str, block: bool) -> Result<Option<Vec<u8>>> {
        loop {
            if block {
                self.wait_raw(vec![user_key(key)], self.timeout)?;
            }
            let v = self.call(&Request::QueuePop(user_key(key)), |r| {
                let len = r.i64()?;
                if len > 0 {
                    Ok(Some(r.bytes()?))
                } else {
                    Ok(None)
                }
            })?;
            // Another consumer may have taken the value we waited for.
            if v.is_some() || !block {
                return Ok(v);
            }
        }
    }

    pub fn queue_len(&self, key: &str) -> Result<i64> {
        self.call(&Request::QueueLen(user_key(key)), |r| r.i64())
    }

    /// Every key as it is on the wire (user keys with their leading `/`).
    pub fn list_keys(&self) -> Result<Vec<Vec<u8>>> {
        self.call(&Request::ListKeys, |r| {
            let n = r.u64()?;
            (0..n).map(|_| r.bytes()).collect()
        })
    }

    /// BARRIER on `key` for `world_size` arrivals.
    pub fn barrier(&self, key: &str, world_size: i64) -> Result<()> {
        self.call(
            &Request::Barrier {
                key: user_key(key),
                world_size,
            },
            |r| r.u8(),
        )
        .map(|_| ())
    }

    /// GET of a raw wire key without waiting (empty when missing).
    pub fn get_raw(&self, key: &[u8]) -> Result<Vec<u8>> {
        self.call(&Request::Get(key.to_vec()), |r| r.bytes())
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        check_args(&[key], &[value.len()])?;
        self.call(
            &Request::Set {
                key: user_key(key),
                value: value.to_vec(),
            },
            |_| Ok(()),
        )
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.wait_raw(vec![user_key(key)], self.timeout)?;
        self.get_raw(&user_key(key))
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.add_raw(&user_key(key), delta)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        check_args(&[key], &[expected.len(), desired.len()])?;
        let req = Request::CompareSet {
            key: user_key(key),
            expected: expected.to_vec(),
            desired: desired.to_vec(),
        };
        self.call(&req, |r| r.bytes())
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        let req = Request::Check(keys.iter().map(|k| user_key(k)).collect());
        self.call(&req, |r| r.u8()).map(|b| b == wire::READY)
    }
    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()> {
        self.wait_raw(
            keys.iter().map(|k| user_key(k)).collect(),
            timeout.unwrap_or(self.timeout),
        )
    }
    fn delete(&self, key: &str) -> Result<bool> {
        self.call(&Request::DeleteKey(user_key(key)), |r| r.i64())
            .map(|n| n > 0)
    }
    fn num_keys(&self) -> Result<i64> {
        self.call(&Request::GetNumKeys, |r| r.i64())
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.append_bytes(key, value)
    }
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        let wire_keys: Vec<Vec<u8>> = keys.iter().map(|k| user_key(k)).collect();
        self.wait_raw(wire_keys.clone(), self.timeout)?;
        let n = wire_keys.len();
        self.call(&Request::MultiGet(wire_keys), |r| {
            (0..n).map(|_| r.bytes()).collect()
        })
    }
    fn multi_set(&self, kvs: &[(&str, &[u8])]) -> Result<()> {
        let keys: Vec<&str> = kvs.iter().map(|(k, _)| *k).collect();
        let lens: Vec<usize> = kvs.iter().map(|(_, v)| v.len()).collect();
        check_args(&keys, &lens)?;
        let req = Request::MultiSet(kvs.iter().map(|(k, v)| (user_key(k), v.to_vec())).collect());
        self.call(&req, |_| Ok(()))
    }
    fn clone_store(&self) -> Result<crate::store::StoreRef> {
        Ok(Arc::new(TcpStore::clone_store(self)?))
    }
}
