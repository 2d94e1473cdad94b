//! The store's data and request semantics (torch's libuv server): keys,
//! queues, parked waits and barriers; replies go to the connections of
//! `conns.rs`, which the event loop in `server.rs` drains.

use crate::store::conns::{ConnId, Conns};
use crate::store::wire::{self, Request};
use std::collections::{HashMap, VecDeque};

/// Largest single reply (a MULTI_GET of many large values): beyond it the
/// request is refused and the connection closed.
const MAX_REPLY: usize = 256 << 20;

struct Wait {
    conn: ConnId,
    remaining: usize,
    keys: Vec<Vec<u8>>,
}

#[derive(Default)]
pub(super) struct State {
    kv: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    /// Key → ids of waits that still need it.
    waiters: HashMap<Vec<u8>, Vec<u64>>,
    waits: HashMap<u64, Wait>,
    /// Barrier key → connections parked on it.
    barriers: HashMap<Vec<u8>, Vec<ConnId>>,
    next_wait: u64,
}

fn parse_int(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

fn show_key(k: &[u8]) -> String {
    String::from_utf8_lossy(&k[..k.len().min(200)]).into_owned()
}

impl State {
    fn exists(&self, k: &[u8]) -> bool {
        self.kv.contains_key(k) || self.queues.get(k).is_some_and(|q| !q.is_empty())
    }

    /// Wakes the waits that needed `key`.
    fn wake(&mut self, conns: &mut Conns, key: &[u8]) {
        let Some(ids) = self.waiters.remove(key) else {
            return;
        };
        for wid in ids {
            let done = match self.waits.get_mut(&wid) {
                Some(w) => {
                    w.remaining -= 1;
                    w.remaining == 0
                }
                None => false,
            };
            if done {
                let w = self.waits.remove(&wid).unwrap();
                if let Some(c) = conns.get_mut(w.conn) {
                    c.waits.retain(|x| *x != wid);
                }
                conns.reply(w.conn, &[wire::STOP_WAITING]);
            }
        }
    }

    fn drop_wait(&mut self, wid: ConnId) {
        if let Some(w) = self.waits.remove(&wid) {
            for k in &w.keys {
                if let Some(list) = self.waiters.get_mut(k) {
                    list.retain(|x| *x != wid);
                    if list.is_empty() {
                        self.waiters.remove(k);
                    }
                }
            }
        }
    }

    /// Drops every wait and barrier arrival of connection `id`.
    pub(super) fn cancel_conn(&mut self, conns: &mut Conns, id: ConnId) {
        if let Some(c) = conns.get_mut(id) {
            for wid in std::mem::take(&mut c.waits) {
                self.drop_wait(wid);
            }
        }
        self.barriers.retain(|_, list| {
            list.retain(|c| *c != id);
            !list.is_empty()
        });
    }

    /// Executes one request of connection `id`; an error closes it.
    pub(super) fn handle(
        &mut self,
        conns: &mut Conns,
        id: ConnId,
        req: Request,
    ) -> std::result::Result<(), String> {
        let mut out = Vec::new();
        match req {
            Request::Validate(m) => {
                if m != wire::VALIDATION_MAGIC {
                    return Err(format!("bad VALIDATE magic {m:#x}"));
                }
            }
            Request::Set { key, value } => {
                self.kv.insert(key.clone(), value);
                self.wake(conns, &key);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                let reply = self.compare_set(conns, key, expected, desired);
                wire::put_bytes(&mut out, &reply);
            }
            Request::Get(key) => {
                wire::put_bytes(&mut out, self.kv.get(&key).map_or(&[][..], |v| v))
            }
            Request::Add { key, delta } => {
                let new = self.add(conns, key, delta)?;
                wire::put_i64(&mut out, new);
            }
            Request::Check(keys) => {
                let ready = keys.iter().all(|k| self.exists(k));
                out.push(if ready { wire::READY } else { wire::NOT_READY });
            }
            Request::Wait(keys) => self.wait(conns, id, keys, &mut out),
            Request::GetNumKeys => wire::put_i64(&mut out, self.kv.len() as i64),
            Request::DeleteKey(key) => self.delete_key(key, &mut out),
            Request::Append { key, value } => self.append(conns, key, value),
            Request::Auth(_) => {}
            Request::MultiGet(keys) => self.multi_get(keys, &mut out)?,
            Request::MultiSet(kvs) => {
                for (k, v) in kvs {
                    self.kv.insert(k.clone(), v);
                    self.wake(conns, &k);
                }
            }
            Request::CancelWait => {
                self.cancel_conn(conns, id);
                out.push(wire::WAIT_CANCELED);
            }
            Request::Ping(n) => wire::put_u32(&mut out, n),
            Request::QueuePush { key, value } => {
                self.queues.entry(key.clone()).or_default().push_back(value);
                self.wake(conns, &key);
            }
            Request::QueuePop(key) => self.queue_pop(key, &mut out),
            Request::QueueLen(key) => wire::put_i64(
                &mut out,
                self.queues.get(&key).map_or(0, |q| q.len()) as i64,
            ),
            Request::ListKeys => self.list_keys(&mut out),
            Request::Barrier { key, world_size } => {
                self.barrier(conns, id, key, world_size, &mut out)?
            }
        }
        if !out.is_empty() {
            conns.reply(id, &out);
        }
        Ok(())
    }

    /// Removes `key` (value and queue); replies 1 when it had a value.
    fn delete_key(&mut self, key: Vec<u8>, out: &mut Vec<u8>) {
        let n = self.kv.remove(&key).is_some() as i64;
        self.queues.remove(&key);
        wire::put_i64(out, n);
    }

    /// Appends `value` to the value at `key` (missing: empty).
    fn append(&mut self, conns: &mut Conns, key: Vec<u8>, value: Vec<u8>) {
        self.kv
            .entry(key.clone())
            .or_default()
            .extend_from_slice(&value);
        self.wake(conns, &key);
    }

    /// The number of keys, then every key.
    fn list_keys(&self, out: &mut Vec<u8>) {
        wire::put_u64(out, self.kv.len() as u64);
        for k in self.kv.keys() {
            wire::put_bytes(out, k);
        }
    }

    /// torch's compare_set: sets `desired` when the key holds `expected`
    /// (or is missing and `expected` is empty); returns the value now
    /// current (`expected` for a missing key with non-empty `expected`).
    fn compare_set(
        &mut self,
        conns: &mut Conns,
        key: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
    ) -> Vec<u8> {
        match self.kv.get(&key) {
            None if expected.is_empty() => {
                self.kv.insert(key.clone(), desired.clone());
                self.wake(conns, &key);
                desired
            }
            None => expected,
            Some(cur) if *cur == expected => {
                self.kv.insert(key.clone(), desired.clone());
                self.wake(conns, &key);
                desired
            }
            Some(cur) => cur.clone(),
        }
    }

    /// The decimal integer at `key` (missing: 0) for request `what`.
    fn counter(&self, key: &[u8], what: &str) -> std::result::Result<i64, String> {
        match self.kv.get(key) {
            None => Ok(0),
            Some(v) => parse_int(v).ok_or_else(|| {
                format!(
                    "{what} on key {:?} whose value is not an integer",
                    show_key(key)
                )
            }),
        }
    }

    /// Adds `delta` to the integer at `key`; the new value.
    fn add(
        &mut self,
        conns: &mut Conns,
        key: Vec<u8>,
        delta: i64,
    ) -> std::result::Result<i64, String> {
        let cur = self.counter(&key, "ADD")?;
        let new = cur
            .checked_add(delta)
            .ok_or_else(|| format!("ADD on key {:?} overflows", show_key(&key)))?;
        self.kv.insert(key.clone(), new.to_string().into_bytes());
        self.wake(conns, &key);
        Ok(new)
    }

    /// Replies STOP_WAITING when every key exists; otherwise parks a wait of
    /// connection `id` on the missing ones.
    fn wait(&mut self, conns: &mut Conns, id: ConnId, keys: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        let missing: Vec<Vec<u8>> = keys.into_iter().filter(|k| !self.exists(k)).collect();
        if missing.is_empty() {
            out.push(wire::STOP_WAITING);
            return;
        }
        let wid = self.next_wait;
        self.next_wait += 1;
        for k in &missing {
            self.waiters.entry(k.clone()).or_default().push(wid);
        }
        self.waits.insert(
            wid,
            Wait {
                conn: id,
                remaining: missing.len(),
                keys: missing,
            },
        );
        if let Some(c) = conns.get_mut(id) {
            c.waits.push(wid);
        }
    }

    /// Every key's value (empty when missing), refused beyond [`MAX_REPLY`].
    fn multi_get(&self, keys: Vec<Vec<u8>>, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        let size: usize = keys
            .iter()
            .map(|k| 8 + self.kv.get(k).map_or(0, |v| v.len()))
            .sum();
        if size > MAX_REPLY {
            return Err(format!(
                "MULTI_GET reply of {size} bytes exceeds the limit of {MAX_REPLY}"
            ));
        }
        for k in keys {
            wire::put_bytes(out, self.kv.get(&k).map_or(&[][..], |v| v));
        }
        Ok(())
    }

    /// The queue's length, then its first value (removed) if any.
    fn queue_pop(&mut self, key: Vec<u8>, out: &mut Vec<u8>) {
        let q = self.queues.get_mut(&key);
        let len = q.as_ref().map_or(0, |q| q.len());
        wire::put_i64(out, len as i64);
        if let Some(q) = q {
            if let Some(v) = q.pop_front() {
                wire::put_bytes(out, &v);
            }
            if q.is_empty() {
                self.queues.remove(&key);
            }
        }
    }

    /// Counts connection `id` in at barrier `key`: the arrival that makes
    /// `world_size` releases every connection parked there.
    fn barrier(
        &mut self,
        conns: &mut Conns,
        id: ConnId,
        key: Vec<u8>,
        world_size: i64,
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), String> {
        let new = self.counter(&key, "BARRIER")?.saturating_add(1);
        self.kv.insert(key.clone(), new.to_string().into_bytes());
        self.wake(conns, &key);
        if new >= world_size {
            out.push(wire::STOP_WAITING);
            for other in self.barriers.remove(&key).unwrap_or_default() {
                conns.reply(other, &[wire::STOP_WAITING]);
            }
        } else {
            self.barriers.entry(key).or_default().push(id);
        }
        Ok(())
    }
}
