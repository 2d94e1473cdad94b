//! Key-value stores used for rendezvous: a TCPStore client and server that
//! speak PyTorch c10d's wire protocol, a FileStore, and a PrefixStore (the
//! store served by the application's callbacks is `ffi::store_callbacks`).
//!
//! Keys are user keys (as Python's `store.set("k")` sees them); the TCP
//! client adds torch's leading `/` on the wire itself.

pub(crate) mod client;
mod conns;
mod epoll;
pub(crate) mod file;
pub(crate) mod handle;
pub(crate) mod prefix;
pub(crate) mod server;
mod state;
pub(crate) mod wire;

pub use client::{TcpStore, TcpStoreOptions};
pub use file::FileStore;
pub(crate) use handle::tc_store_t;
pub use prefix::PrefixStore;
pub use server::{raise_nofile_limit, token_from_env, ServerOptions, TcpStoreServer};
/// A c10d wire request, encoded with `to_bytes`: for tools and tests that
/// speak the protocol raw (idle clients, malformed or partial requests).
pub use wire::Request;

use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// A rendezvous store. Implementations are thread-safe: one store may be used
/// from several threads at once.
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, waking waiters on it.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Waits up to the store's timeout for `key`, then returns its value.
    fn get(&self, key: &str) -> Result<Vec<u8>>;
    /// Adds `delta` to the decimal integer at `key` (missing = 0); returns the
    /// new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// torch's compare_set: see tcpstore-protocol.md; returns the value now
    /// current (or `expected` for a missing key with non-empty `expected`).
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>>;
    /// True when every key exists.
    fn check(&self, keys: &[&str]) -> Result<bool>;
    /// Waits until every key exists, or fails with `TC_ERR_TIMEOUT` after
    /// `timeout` (None: the store's timeout).
    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()>;
    /// Deletes `key`; true when it existed.
    fn delete(&self, key: &str) -> Result<bool>;
    /// Number of keys (torch counts `init/` too).
    fn num_keys(&self) -> Result<i64>;
    /// The store's default timeout for get and wait.
    fn timeout(&self) -> Duration;
    /// Appends `value` to `key`'s value, creating the key when missing.
    fn append(&self, key: &str, _value: &[u8]) -> Result<()> {
        Err(Error::unsupported(format!(
            "append (key {key:?}) is not supported by this store"
        )))
    }
    /// Waits for every key, then returns their values in order.
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }
    /// Sets every pair.
    fn multi_set(&self, kvs: &[(&str, &[u8])]) -> Result<()> {
        kvs.iter().try_for_each(|(k, v)| self.set(k, v))
    }
    /// A second, independent handle on the same store (a new connection for
    /// the TCP store).
    fn clone_store(&self) -> Result<StoreRef> {
        Err(Error::unsupported("clone is not supported by this store"))
    }
}

pub type StoreRef = Arc<dyn Store>;
