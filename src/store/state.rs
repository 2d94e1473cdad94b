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
                let reply = match self.kv.get(&key) {
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
                };
                wire::put_bytes(&mut out, &reply);
            }
            Request::Get(key) => {
                wire::put_bytes(&mut out, self.kv.get(&key).map_or(&[][..], |v| v))
            }
            Request::Add { key, delta } => {
                let cur = match self.kv.get(&key) {
                    None => 0,
                    Some(v) => parse_int(v).ok_or_else(|| {
                        format!(
                            "ADD on key {:?} whose value is not an integer",
                            show_key(&key)
                        )
                    })?,
                };
                let new = cur
                    .checked_add(delta)
                    .ok_or_else(|| format!("ADD on key {:?} overflows", show_key(&key)))?;
                self.kv.insert(key.clone(), new.to_string().into_bytes());
                self.wake(conns, &key);
                wire::put_i64(&mut out, new);
            }
            Request::Check(keys) => {
                let ready = keys.iter().all(|k| self.exists(k));
                out.push(if ready { wire::READY } else { wire::NOT_READY });
            }
            Request::Wait(keys) => {
                let missing: Vec<Vec<u8>> = keys.into_iter().filter(|k| !self.exists(k)).collect();
                if missing.is_empty() {
                    out.push(wire::STOP_WAITING);
                } else {
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
            }
            Request::GetNumKeys => wire::put_i64(&mut out, self.kv.len() as i64),
            Request::DeleteKey(key) => {
                let n = self.kv.remove(&key).is_some() as i64;
                self.queues.remove(&key);
                wire::put_i64(&mut out, n);
            }
            Request::Append { key, value } => {
                self.kv
                    .entry(key.clone())
                    .or_default()
                    .extend_from_slice(&value);
                self.wake(conns, &key);
            }
            Request::Auth(_) => {}
            Request::MultiGet(keys) => {
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
                    wire::put_bytes(&mut out, self.kv.get(&k).map_or(&[][..], |v| v));
                }
            }
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
            Request::QueuePop(key) => {
                let q = self.queues.get_mut(&key);
                let len = q.as_ref().map_or(0, |q| q.len());
                wire::put_i64(&mut out, len as i64);
                if let Some(q) = q {
                    if let Some(v) = q.pop_front() {
                        wire::put_bytes(&mut out, &v);
                    }
                    if q.is_empty() {
                        self.queues.remove(&key);
                    }
                }
            }
            Request::QueueLen(key) => wire::put_i64(
                &mut out,
                self.queues.get(&key).map_or(0, |q| q.len()) as i64,
            ),
            Request::ListKeys => {
                wire::put_u64(&mut out, self.kv.len() as u64);
                for k in self.kv.keys() {
                    wire::put_bytes(&mut out, k);
                }
            }
            Request::Barrier { key, world_size } => {
                let cur = match self.kv.get(&key) {
                    None => 0,
                    Some(v) => parse_int(v).ok_or_else(|| {
                        format!(
                            "BARRIER on key {:?} whose value is not an integer",
                            show_key(&key)
                        )
                    })?,
                };
                let new = cur.saturating_add(1);
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
            }
        }
        if !out.is_empty() {
            conns.reply(id, &out);
        }
        Ok(())
    }
}
