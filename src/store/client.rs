//! The TCPStore client: torch's handshake (VALIDATE, then PING with the pid),
//! connect retries with backoff, WAIT before GET, CANCEL_WAIT after a local
//! wait timeout, and `/` in front of every user key.

use crate::error::{Error, ErrorKind, Result};
use crate::store::server::TcpStoreServer;
use crate::store::wire::{self, ReplyReader, Request};
use crate::store::Store;
use std::io::{ErrorKind as IoKind, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The raw key every process ADDs to when waiting for workers.
pub const INIT_KEY: &str = "init/";

/// How a [`TcpStore`] is created.
#[derive(Debug, Clone)]
pub struct TcpStoreOptions {
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
        }
    }
    pub fn server(port: u16, timeout: Duration) -> TcpStoreOptions {
        TcpStoreOptions {
            host: "127.0.0.1".into(),
            port,
            is_server: true,
            world_size: None,
            wait_for_workers: true,
            timeout,
        }
    }
}

struct Conn {
    stream: TcpStream,
    /// An earlier failure left the stream in an unknown state.
    broken: Option<String>,
}

/// A TCPStore client connection (optionally owning the server it hosts).
/// Thread-safe: requests on one connection are serialized, as in torch.
pub struct TcpStore {
    host: String,
    port: u16,
    timeout: Duration,
    conn: Mutex<Conn>,
    server: Option<Arc<TcpStoreServer>>,
}

fn user_key(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(b'/');
    k.extend_from_slice(key.as_bytes());
    k
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

fn io_err(host: &str, port: u16, what: &str, e: std::io::Error) -> Error {
    let kind = match e.kind() {
        IoKind::WouldBlock | IoKind::TimedOut => ErrorKind::Timeout,
        IoKind::UnexpectedEof
        | IoKind::ConnectionReset
        | IoKind::ConnectionAborted
        | IoKind::BrokenPipe => ErrorKind::Remote,
        _ => ErrorKind::System,
    };
    let detail = if e.kind() == IoKind::UnexpectedEof {
        "the server closed the connection".to_string()
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

impl TcpStore {
    /// Connects (hosting the server first when `is_server`), performs the
    /// handshake, then waits for workers when asked to.
    pub fn new(opts: &TcpStoreOptions) -> Result<TcpStore> {
        if opts.world_size == Some(0) {
            return Err(Error::invalid_argument(
                "world_size must be positive (or unknown), not 0",
            ));
        }
        let mut port = opts.port;
        let server = if opts.is_server {
            let s = TcpStoreServer::start(opts.port)?;
            port = s.port();
            Some(Arc::new(s))
        } else {
            None
        };
        let host = if opts.is_server && opts.host.is_empty() {
            "127.0.0.1".to_string()
        } else {
            opts.host.clone()
        };
        let store = TcpStore::connect(&host, port, opts.timeout, server)?;
        if let (Some(n), true) = (opts.world_size, opts.wait_for_workers) {
            store.wait_for_workers(n, opts.is_server)?;
        }
        Ok(store)
    }

    fn connect(
        host: &str,
        port: u16,
        timeout: Duration,
        server: Option<Arc<TcpStoreServer>>,
    ) -> Result<TcpStore> {
        let mut stream = connect_with_retry(host, port, timeout)?;
        stream
            .set_nodelay(true)
            .map_err(|e| io_err(host, port, "TCP_NODELAY", e))?;
        stream
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(|e| io_err(host, port, "timeout", e))?;
        let nonce = std::process::id();
        let mut hello = Request::Validate(wire::VALIDATION_MAGIC).to_bytes();
        stream
            .write_all(&hello)
            .map_err(|e| io_err(host, port, "VALIDATE", e))?;
        hello.clear();
        Request::Ping(nonce).encode(&mut hello);
        stream
            .write_all(&hello)
            .map_err(|e| io_err(host, port, "PING", e))?;
        let echo = ReplyReader { inner: &mut stream }
            .u32()
            .map_err(|e| io_err(host, port, "PING reply", e))?;
        if echo != nonce {
            return Err(Error::remote(format!(
                "store {host}:{port}: PING returned {echo:#x}, expected {nonce:#x}"
            )));
        }
        Ok(TcpStore {
            host: host.into(),
            port,
            timeout,
            conn: Mutex::new(Conn {
                stream,
                broken: None,
            }),
            server,
        })
    }

    /// A second connection to the same server (torch's `clone`); it shares
    /// ownership of a hosted server.
    pub fn clone_store(&self) -> Result<TcpStore> {
        TcpStore::connect(&self.host, self.port, self.timeout, self.server.clone())
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

    /// Sends `req` and reads its reply with `read`, holding the connection.
    fn call<T>(
        &self,
        req: &Request,
        read: impl FnOnce(&mut ReplyReader<TcpStream>) -> std::io::Result<T>,
    ) -> Result<T> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        self.call_locked(&mut conn, req, read)
    }

    fn call_locked<T>(
        &self,
        conn: &mut Conn,
        req: &Request,
        read: impl FnOnce(&mut ReplyReader<TcpStream>) -> std::io::Result<T>,
    ) -> Result<T> {
        if let Some(why) = &conn.broken {
            return Err(Error::remote(format!(
                "store {}:{}: connection unusable after an earlier failure: {why}",
                self.host, self.port
            )));
        }
        let bytes = req.to_bytes();
        let res = conn.stream.write_all(&bytes).and_then(|_| {
            read(&mut ReplyReader {
                inner: &mut conn.stream,
            })
        });
        res.map_err(|e| {
            let err = io_err(&self.host, self.port, &format!("query {}", req.code()), e);
            conn.broken = Some(err.message.clone());
            err
        })
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
    /// and keeps the connection usable.
    fn wait_raw(&self, keys: Vec<Vec<u8>>, timeout: Duration) -> Result<()> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let conn = &mut *guard;
        if let Some(why) = &conn.broken {
            return Err(Error::remote(format!(
                "store {}:{}: connection unusable after an earlier failure: {why}",
                self.host, self.port
            )));
        }
        let req = Request::Wait(keys.clone());
        if let Err(e) = conn.stream.write_all(&req.to_bytes()) {
            let err = io_err(&self.host, self.port, "WAIT", e);
            conn.broken = Some(err.message.clone());
            return Err(err);
        }
        let _ = conn
            .stream
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))));
        let first = ReplyReader {
            inner: &mut conn.stream,
        }
        .u8();
        let _ = conn
            .stream
            .set_read_timeout(Some(self.timeout.max(Duration::from_millis(1))));
        match first {
            Ok(wire::STOP_WAITING) => Ok(()),
            Ok(other) => {
                conn.broken = Some(format!("unexpected WAIT reply {other}"));
                Err(Error::remote(format!(
                    "store {}:{}: unexpected WAIT reply {other}",
                    self.host, self.port
                )))
            }
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => {
                // Cancel; a STOP_WAITING that raced with us comes first.
                let cancel = Request::CancelWait.to_bytes();
                let res = conn.stream.write_all(&cancel).and_then(|_| {
                    let mut r = ReplyReader {
                        inner: &mut conn.stream,
                    };
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
                    let err = io_err(&self.host, self.port, "CANCEL_WAIT", e);
                    conn.broken = Some(err.message.clone());
                }
                Err(wait_timeout_error(timeout, &keys))
            }
            Err(e) => {
                let err = io_err(&self.host, self.port, "WAIT", e);
                conn.broken = Some(err.message.clone());
                Err(err)
            }
        }
    }

    /// APPEND: adds `value` to the end of `key`'s value (creating it).
    pub fn append_bytes(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call(
            &Request::Append {
                key: user_key(key),
                value: value.to_vec(),
            },
            |_| Ok(()),
        )
    }

    pub fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
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
        let req = Request::MultiSet(kvs.iter().map(|(k, v)| (user_key(k), v.to_vec())).collect());
        self.call(&req, |_| Ok(()))
    }
    fn clone_store(&self) -> Result<crate::store::StoreRef> {
        Ok(Arc::new(TcpStore::clone_store(self)?))
    }
}
