//! The c10d TCPStore wire format (see `tcpstore-protocol.md`): requests as
//! a query-code byte followed by the body, little-endian integers, and
//! `u64 length + bytes` strings. Decoding is incremental: a partial request
//! reports [`Decode::Incomplete`] and is decoded again when more bytes came.

use std::io::Read;

/// Magic sent with VALIDATE (`00 CE F7 85 3C` on the wire).
pub(crate) const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

pub(crate) const VALIDATE: u8 = 0;
pub(crate) const SET: u8 = 1;
pub(crate) const COMPARE_SET: u8 = 2;
pub(crate) const GET: u8 = 3;
pub(crate) const ADD: u8 = 4;
pub(crate) const CHECK: u8 = 5;
pub(crate) const WAIT: u8 = 6;
pub(crate) const GETNUMKEYS: u8 = 7;
pub(crate) const DELETE_KEY: u8 = 8;
pub(crate) const APPEND: u8 = 9;
pub(crate) const MULTI_GET: u8 = 10;
pub(crate) const MULTI_SET: u8 = 11;
pub(crate) const CANCEL_WAIT: u8 = 12;
pub(crate) const PING: u8 = 13;
pub(crate) const QUEUE_PUSH: u8 = 14;
pub(crate) const QUEUE_POP: u8 = 15;
pub(crate) const QUEUE_LEN: u8 = 16;
pub(crate) const LIST_KEYS: u8 = 17;
pub(crate) const BARRIER: u8 = 18;
/// Our extension, a code torch never sends: the store token (see
/// [`Request::Auth`]). A torch server drops a connection that sends it.
pub(crate) const AUTH: u8 = 200;
/// Magic that opens an AUTH body, so that a stray 200 is not taken for one.
pub(crate) const AUTH_MAGIC: u32 = 0x4B54_4354;
/// Longest store token accepted.
pub const MAX_TOKEN_LEN: usize = 4096;

/// CHECK replies.
pub(crate) const READY: u8 = 0;
pub(crate) const NOT_READY: u8 = 1;
/// WAIT / BARRIER / CANCEL_WAIT replies.
pub(crate) const STOP_WAITING: u8 = 0;
pub(crate) const WAIT_CANCELED: u8 = 1;

/// Limits of torch's libuv server; a request beyond them closes the
/// connection. Keys are counted as they travel (torch's leading `/` included).
pub const MAX_KEY_LEN: usize = 8 * 1024;
pub const MAX_VALUE_LEN: usize = 8 * 1024 * 1024;
pub const MAX_KEYS_PER_REQUEST: usize = 128 * 1024;

/// One request, with keys exactly as they travel (torch's `/` included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Validate(u32),
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    CompareSet {
        key: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Get(Vec<u8>),
    Add {
        key: Vec<u8>,
        delta: i64,
    },
    Check(Vec<Vec<u8>>),
    Wait(Vec<Vec<u8>>),
    GetNumKeys,
    DeleteKey(Vec<u8>),
    Append {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    MultiGet(Vec<Vec<u8>>),
    MultiSet(Vec<(Vec<u8>, Vec<u8>)>),
    CancelWait,
    Ping(u32),
    QueuePush {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    QueuePop(Vec<u8>),
    QueueLen(Vec<u8>),
    ListKeys,
    Barrier {
        key: Vec<u8>,
        world_size: i64,
    },
    /// Our extension: the store token, sent right after VALIDATE by a client
    /// configured with one; a server configured with a token closes any
    /// connection whose second message is not this with the right token.
    /// No reply.
    Auth(Vec<u8>),
}

pub fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}
fn put_keys<K: AsRef<[u8]>>(out: &mut Vec<u8>, keys: &[K]) {
    put_u64(out, keys.len() as u64);
    for k in keys {
        put_bytes(out, k.as_ref());
    }
}

impl Request {
    pub fn code(&self) -> u8 {
        match self {
            Request::Validate(_) => VALIDATE,
            Request::Set { .. } => SET,
            Request::CompareSet { .. } => COMPARE_SET,
            Request::Get(_) => GET,
            Request::Add { .. } => ADD,
            Request::Check(_) => CHECK,
            Request::Wait(_) => WAIT,
            Request::GetNumKeys => GETNUMKEYS,
            Request::DeleteKey(_) => DELETE_KEY,
            Request::Append { .. } => APPEND,
            Request::MultiGet(_) => MULTI_GET,
            Request::MultiSet(_) => MULTI_SET,
            Request::CancelWait => CANCEL_WAIT,
            Request::Ping(_) => PING,
            Request::QueuePush { .. } => QUEUE_PUSH,
            Request::QueuePop(_) => QUEUE_POP,
            Request::QueueLen(_) => QUEUE_LEN,
            Request::ListKeys => LIST_KEYS,
            Request::Barrier { .. } => BARRIER,
            Request::Auth(_) => AUTH,
        }
    }

    /// The query's name, for messages.
    pub fn name(&self) -> &'static str {
        const NAMES: [&str; 19] = [
            "VALIDATE",
            "SET",
            "COMPARE_SET",
            "GET",
            "ADD",
            "CHECK",
            "WAIT",
            "GETNUMKEYS",
            "DELETE_KEY",
            "APPEND",
            "MULTI_GET",
            "MULTI_SET",
            "CANCEL_WAIT",
            "PING",
            "QUEUE_PUSH",
            "QUEUE_POP",
            "QUEUE_LEN",
            "LIST_KEYS",
            "BARRIER",
        ];
        NAMES.get(self.code() as usize).copied().unwrap_or("AUTH")
    }

    /// The request's first key, for messages.
    pub fn first_key(&self) -> Option<&[u8]> {
        match self {
            Request::Set { key, .. }
            | Request::CompareSet { key, .. }
            | Request::Add { key, .. }
            | Request::Append { key, .. }
            | Request::QueuePush { key, .. }
            | Request::Barrier { key, .. }
            | Request::Get(key)
            | Request::DeleteKey(key)
            | Request::QueuePop(key)
            | Request::QueueLen(key) => Some(key),
            Request::Check(keys) | Request::Wait(keys) | Request::MultiGet(keys) => {
                keys.first().map(|k| &k[..])
            }
            Request::MultiSet(kvs) => kvs.first().map(|(k, _)| &k[..]),
            _ => None,
        }
    }

    /// Appends the request's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u8(out, self.code());
        match self {
            Request::Validate(m) | Request::Ping(m) => put_u32(out, *m),
            Request::Set { key, value }
            | Request::Append { key, value }
            | Request::QueuePush { key, value } => {
                put_bytes(out, key);
                put_bytes(out, value);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                put_bytes(out, key);
                put_bytes(out, expected);
                put_bytes(out, desired);
            }
            Request::Get(k)
            | Request::DeleteKey(k)
            | Request::QueuePop(k)
            | Request::QueueLen(k) => put_bytes(out, k),
            Request::Add { key, delta } => {
                put_bytes(out, key);
                put_i64(out, *delta);
            }
            Request::Check(keys) | Request::Wait(keys) | Request::MultiGet(keys) => {
                put_keys(out, keys)
            }
            Request::MultiSet(kvs) => {
                put_u64(out, kvs.len() as u64);
                for (k, v) in kvs {
                    put_bytes(out, k);
                    put_bytes(out, v);
                }
            }
            Request::GetNumKeys | Request::CancelWait | Request::ListKeys => {}
            Request::Barrier { key, world_size } => {
                put_bytes(out, key);
                put_i64(out, *world_size);
            }
            Request::Auth(token) => {
                put_u32(out, AUTH_MAGIC);
                put_bytes(out, token);
            }
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
}

/// Checks a request against the server's limits before it is sent, so that
/// the caller gets the reason instead of a closed connection.
pub fn check_limits(req: &Request) -> Result<(), String> {
    match req {
        Request::Set { key, value }
        | Request::Append { key, value }
        | Request::QueuePush { key, value } => {
            check_key(key)?;
            check_value(value.len())
        }
        Request::CompareSet {
            key,
            expected,
            desired,
        } => {
            check_key(key)?;
            check_value(expected.len())?;
            check_value(desired.len())
        }
        Request::Check(keys) | Request::Wait(keys) | Request::MultiGet(keys) => {
            check_count(keys.len())?;
            keys.iter().try_for_each(|k| check_key(k))
        }
        Request::MultiSet(kvs) => {
            check_count(kvs.len())?;
            kvs.iter().try_for_each(|(k, v)| {
                check_key(k)?;
                check_value(v.len())
            })
        }
        other => other.first_key().map_or(Ok(()), check_key),
    }
}

/// Checks one key, in its wire form, against the server's limit.
pub fn check_key(key: &[u8]) -> Result<(), String> {
    if key.len() > MAX_KEY_LEN {
        return Err(format!(
            "key {:?}... is {} bytes on the wire, over the store's key limit of {MAX_KEY_LEN} bytes",
            String::from_utf8_lossy(&key[..40]),
            key.len()
        ));
    }
    Ok(())
}

/// Checks one value against the server's limit.
pub fn check_value(value_len: usize) -> Result<(), String> {
    if value_len > MAX_VALUE_LEN {
        return Err(format!(
            "a value of {value_len} bytes is over the store's value limit of {MAX_VALUE_LEN} bytes"
        ));
    }
    Ok(())
}

/// Checks a number of keys in one request against the server's limit.
pub fn check_count(n: usize) -> Result<(), String> {
    if n > MAX_KEYS_PER_REQUEST {
        return Err(format!(
            "{n} keys in one request are over the store's limit of {MAX_KEYS_PER_REQUEST}"
        ));
    }
    Ok(())
}

/// Why a request could not be decoded (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decode {
    /// More bytes are needed.
    Incomplete,
    /// The bytes can never form a valid request: the connection must close.
    Malformed(String),
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Decode> {
        if self.buf.len() - self.pos < n {
            return Err(Decode::Incomplete);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, Decode> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, Decode> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn i64(&mut self) -> Result<i64, Decode> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self, max: usize, what: &str) -> Result<Vec<u8>, Decode> {
        let len = self.u64()?;
        if len > max as u64 {
            return Err(Decode::Malformed(format!(
                "{what} of {len} bytes exceeds the limit of {max}"
            )));
        }
        Ok(self.take(len as usize)?.to_vec())
    }
    fn key(&mut self) -> Result<Vec<u8>, Decode> {
        self.bytes(MAX_KEY_LEN, "key")
    }
    fn value(&mut self) -> Result<Vec<u8>, Decode> {
        self.bytes(MAX_VALUE_LEN, "value")
    }
    fn count(&mut self) -> Result<usize, Decode> {
        let n = self.u64()?;
        if n > MAX_KEYS_PER_REQUEST as u64 {
            return Err(Decode::Malformed(format!(
                "{n} keys in one request exceed the limit of {MAX_KEYS_PER_REQUEST}"
            )));
        }
        Ok(n as usize)
    }
    fn keys(&mut self) -> Result<Vec<Vec<u8>>, Decode> {
        let n = self.count()?;
        // Reserve by what the bytes present can hold, not by the claimed count.
        let mut keys = Vec::with_capacity(n.min((self.buf.len() - self.pos) / 8));
        for _ in 0..n {
            keys.push(self.key()?);
        }
        Ok(keys)
    }
}

/// Decodes one request from the front of `buf`; returns it and the number of
/// bytes it used.
pub fn decode_request(buf: &[u8]) -> Result<(Request, usize), Decode> {
    let mut c = Cursor { buf, pos: 0 };
    let code = c.take(1)?[0];
    let req = match code {
        VALIDATE => Request::Validate(c.u32()?),
        SET => Request::Set {
            key: c.key()?,
            value: c.value()?,
        },
        COMPARE_SET => Request::CompareSet {
            key: c.key()?,
            expected: c.value()?,
            desired: c.value()?,
        },
        GET => Request::Get(c.key()?),
        ADD => Request::Add {
            key: c.key()?,
            delta: c.i64()?,
        },
        CHECK => Request::Check(c.keys()?),
        WAIT => Request::Wait(c.keys()?),
        GETNUMKEYS => Request::GetNumKeys,
        DELETE_KEY => Request::DeleteKey(c.key()?),
        APPEND => Request::Append {
            key: c.key()?,
            value: c.value()?,
        },
        MULTI_GET => Request::MultiGet(c.keys()?),
        MULTI_SET => {
            let n = c.count()?;
            let mut kvs = Vec::with_capacity(n.min((buf.len() - c.pos) / 16));
            for _ in 0..n {
                let k = c.key()?;
                let v = c.value()?;
                kvs.push((k, v));
            }
            Request::MultiSet(kvs)
        }
        CANCEL_WAIT => Request::CancelWait,
        PING => Request::Ping(c.u32()?),
        QUEUE_PUSH => Request::QueuePush {
            key: c.key()?,
            value: c.value()?,
        },
        QUEUE_POP => Request::QueuePop(c.key()?),
        QUEUE_LEN => Request::QueueLen(c.key()?),
        LIST_KEYS => Request::ListKeys,
        BARRIER => Request::Barrier {
            key: c.key()?,
            world_size: c.i64()?,
        },
        AUTH => {
            let magic = c.u32()?;
            if magic != AUTH_MAGIC {
                return Err(Decode::Malformed(format!(
                    "query code {AUTH} without the token magic"
                )));
            }
            Request::Auth(c.bytes(MAX_TOKEN_LEN, "store token")?)
        }
        other => return Err(Decode::Malformed(format!("unknown query code {other}"))),
    };
    Ok((req, c.pos))
}

/// Reading replies from a blocking stream (the client side).
pub struct ReplyReader<'a, R: Read> {
    pub inner: &'a mut R,
}

/// A reply value longer than this is taken as a corrupt stream.
pub(crate) const MAX_REPLY_LEN: u64 = 1 << 32;

impl<R: Read> ReplyReader<'_, R> {
    pub fn u8(&mut self) -> std::io::Result<u8> {
        let mut b = [0u8; 1];
        self.inner.read_exact(&mut b)?;
        Ok(b[0])
    }
    pub fn u32(&mut self) -> std::io::Result<u32> {
        let mut b = [0u8; 4];
        self.inner.read_exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    pub fn u64(&mut self) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        self.inner.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    pub fn i64(&mut self) -> std::io::Result<i64> {
        Ok(self.u64()? as i64)
    }
    pub fn bytes(&mut self) -> std::io::Result<Vec<u8>> {
        let len = self.u64()?;
        if len > MAX_REPLY_LEN {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("reply length {len} is implausible"),
            ));
        }
        let mut v = vec![0u8; len as usize];
        self.inner.read_exact(&mut v)?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests;
