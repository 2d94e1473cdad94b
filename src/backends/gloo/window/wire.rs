//! What window ranks exchange: connection addresses at creation and each
//! rank's registration record.

use super::super::shim;
use super::super::shm::Placement;
use super::TAG_ADDRESSES;
use std::time::Duration;

/// Every rank publishes the local address of each of its connections, so
/// that a Gloo message naming a peer's address names its rank here (where
/// Gloo knows the address: a connection this rank accepted may be reported
/// by the peer's listening address, and then stays unnamed).
pub(super) fn exchange_addresses(
    ctx: &shim::Context,
    rank: i32,
    size: i32,
    timeout: Duration,
) -> std::result::Result<Vec<String>, shim::CallError> {
    const LEN: usize = 64;
    let (n, me) = (size as usize, rank as usize);
    let mut mine = vec![0u8; n * LEN];
    for j in (0..n).filter(|j| *j != me) {
        let a = ctx.pair_address(j as i32)?;
        let len = a.len().min(LEN - 1);
        mine[j * LEN..j * LEN + len].copy_from_slice(&a.as_bytes()[..len]);
    }
    let mut all = vec![0u8; n * n * LEN];
    // SAFETY: both buffers hold the sizes given.
    unsafe {
        ctx.allgather(
            mine.as_ptr(),
            all.as_mut_ptr(),
            n * LEN,
            TAG_ADDRESSES,
            timeout,
        )?
    };
    Ok((0..n)
        .map(|j| {
            let bytes = &all[(j * n + me) * LEN..(j * n + me + 1) * LEN];
            let end = bytes.iter().position(|b| *b == 0).unwrap_or(LEN);
            String::from_utf8_lossy(&bytes[..end]).into_owned()
        })
        .collect())
}

/// What each rank tells the others at registration: its buffer's size,
/// where it lies in shared memory (if it does), and its host.
pub(super) struct Registration {
    pub(super) bytes: u64,
    /// The buffer, when it lies in shared memory.
    pub(super) shared: Option<Placement>,
    /// The window's signal area, when it is shared.
    pub(super) signals: Option<Placement>,
    pub(super) host: [u64; 2],
}

/// u64 words of an encoded [`Registration`].
pub(super) const RECORD: usize = 17;

pub(super) fn encode_placement(p: Option<Placement>) -> [u64; 7] {
    let q = p.unwrap_or_default();
    [
        p.is_some() as u64,
        q.pid,
        q.fd,
        q.offset,
        q.len,
        q.dev,
        q.ino,
    ]
}

pub(super) fn decode_placement(w: &[u64]) -> Option<Placement> {
    (w[0] == 1).then(|| Placement {
        pid: w[1],
        fd: w[2],
        offset: w[3],
        len: w[4],
        dev: w[5],
        ino: w[6],
    })
}

impl Registration {
    pub(super) fn encode(&self) -> [u64; RECORD] {
        let mut out = [0u64; RECORD];
        out[0] = self.bytes;
        out[1..8].copy_from_slice(&encode_placement(self.shared));
        out[8..15].copy_from_slice(&encode_placement(self.signals));
        out[15..17].copy_from_slice(&self.host);
        out
    }

    pub(super) fn decode(w: &[u64]) -> Registration {
        Registration {
            bytes: w[0],
            shared: decode_placement(&w[1..8]),
            signals: decode_placement(&w[8..15]),
            host: [w[15], w[16]],
        }
    }
}
