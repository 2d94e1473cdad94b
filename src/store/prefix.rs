//! PrefixStore: torch's rule, `key` becomes `prefix + "/" + key`, so nested
//! prefixes give `a/b/key` and, over a TCP store, `/a/b/key` on the wire.

use crate::error::Result;
use crate::store::{Store, StoreRef};
use std::sync::Arc;
use std::time::Duration;

/// A view of `base` where every key lives under `prefix/`.
pub struct PrefixStore {
    prefix: String,
    base: StoreRef,
}

impl PrefixStore {
    pub fn new(prefix: &str, base: StoreRef) -> PrefixStore {
        PrefixStore {
            prefix: prefix.to_string(),
            base,
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn base(&self) -> &StoreRef {
        &self.base
    }

    /// The key `key` maps to in the base store.
    pub fn full_key(&self, key: &str) -> String {
        format!("{}/{}", self.prefix, key)
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.base.set(&self.full_key(key), value)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.base.get(&self.full_key(key))
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.base.add(&self.full_key(key), delta)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.base
            .compare_set(&self.full_key(key), expected, desired)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        let full: Vec<String> = keys.iter().map(|k| self.full_key(k)).collect();
        self.base
            .check(&full.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    }
    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()> {
        let full: Vec<String> = keys.iter().map(|k| self.full_key(k)).collect();
        self.base.wait(
            &full.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            timeout,
        )
    }
    fn delete(&self, key: &str) -> Result<bool> {
        self.base.delete(&self.full_key(key))
    }
    /// Counts the whole base store, as torch's PrefixStore does.
    fn num_keys(&self) -> Result<i64> {
        self.base.num_keys()
    }
    fn timeout(&self) -> Duration {
        self.base.timeout()
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.base.append(&self.full_key(key), value)
    }
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        let full: Vec<String> = keys.iter().map(|k| self.full_key(k)).collect();
        self.base
            .multi_get(&full.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    }
    fn multi_set(&self, kvs: &[(&str, &[u8])]) -> Result<()> {
        let full: Vec<(String, &[u8])> = kvs.iter().map(|(k, v)| (self.full_key(k), *v)).collect();
        self.base.multi_set(
            &full
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
        )
    }
    fn clone_store(&self) -> Result<StoreRef> {
        Ok(Arc::new(PrefixStore::new(
            &self.prefix,
            self.base.clone_store()?,
        )))
    }
}
