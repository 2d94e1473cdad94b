//! The comm's `tc_mem_alloc` memory as a window over UCX maps it: a
//! registered buffer inside it is described by its placement and host, and
//! a same-host peer's is mapped as the Gloo window maps it.

use super::super::shm::{host_id, PeerMapping, SharedAllocations};
use super::wire::{decode_placement, encode_placement};
use crate::backends::ucx::SameHostMemory;
use std::sync::Arc;

/// u64 words of a record: the placement, then the host.
const WORDS: usize = 9;

pub(super) struct SharedBuffers {
    pub(super) allocations: Arc<SharedAllocations>,
    /// Names the window in the log line of a mapping that failed.
    pub(super) label: String,
}

impl SameHostMemory for SharedBuffers {
    fn describe(&self, buf: usize, bytes: usize) -> Vec<u8> {
        let host = host_id();
        let Some(at) = self.allocations.placement(buf, bytes) else {
            return Vec::new();
        };
        if host == [0, 0] {
            return Vec::new();
        }
        let mut words = encode_placement(Some(at)).to_vec();
        words.extend_from_slice(&host);
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn map(&self, record: &[u8]) -> Option<(*mut u8, Box<dyn Send + Sync>)> {
        if record.len() != 8 * WORDS {
            return None;
        }
        let words: Vec<u64> = record
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        if words[7..] != host_id() {
            return None;
        }
        let at = decode_placement(&words[..7])?;
        match PeerMapping::map(&at) {
            Ok(m) => Some((m.ptr, Box::new(m))),
            Err(e) => {
                crate::log_info!(
                    "ucx {}: a same-host peer's shared buffer cannot be mapped here ({e}); \
                     map_remote of it is refused",
                    self.label
                );
                None
            }
        }
    }
}
