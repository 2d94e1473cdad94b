//! Creation: the Gloo context over the comm's store, the hello that agrees
//! on settings with every peer, and the exchange of peer addresses used to
//! name a failed peer.

use super::store_bridge::{store_get, store_set, store_wait};
use super::{shim, GlooTcp, Seqs, HELLO_MAGIC};
use crate::backends::gloo::failure::FailureReports;
use crate::backends::BackendInit;
use crate::error::{Error, Result};
use crate::store::StoreRef;
use crate::util::Deadline;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How a comm's Gloo contexts choose their addresses (the hints
/// `gloo.hostname`, `gloo.iface`, else the environment).
pub(in crate::backends::gloo) struct ContextOptions {
    hostname: Option<String>,
    iface: Option<String>,
}

impl ContextOptions {
    fn of(init: &BackendInit) -> ContextOptions {
        let hostname = init.setting("gloo.hostname", "TORCHCOMM_GLOO_HOSTNAME");
        let iface = init
            .setting("gloo.iface", "TORCHCOMM_GLOO_IFACE")
            .or_else(|| init.setting("gloo.iface", "GLOO_SOCKET_IFNAME"));
        ContextOptions { hostname, iface }
    }

    /// Connects a full mesh of `size` ranks through `store` (collective);
    /// `what` names it in errors ("comm 'x'", "window 3 of comm 'x'").
    pub(in crate::backends::gloo) fn connect(
        &self,
        (rank, size): (i32, i32),
        store: &StoreRef,
        timeout: Duration,
        what: &str,
    ) -> Result<shim::Context> {
        let vt = shim::StoreVtable {
            user: store as *const StoreRef as *mut c_void,
            set: store_set,
            get: store_get,
            wait: store_wait,
        };
        let module = shim::module()?;
        let (host, iface) = (self.hostname.as_deref(), self.iface.as_deref());
        shim::Context::new(module, rank, size, &vt, timeout, host, iface).map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "gloo {what}: connecting rank {rank} of {size}: {}",
                    e.message
                ),
            )
        })
    }
}

impl GlooTcp {
    /// Connects the comm's ranks (collective): loads the Gloo module,
    /// connects the full mesh through the comm's store and agrees on
    /// settings with every peer.
    pub(in crate::backends::gloo) fn connect(
        init: &BackendInit,
        reports: Arc<FailureReports>,
    ) -> Result<GlooTcp> {
        let module = shim::module()?;
        let n = init.size as usize;
        let options = ContextOptions::of(init);
        let what = format!("comm '{}'", init.name);
        let ctx = match init.size {
            ..=1 => None,
            _ => Some(options.connect((init.rank, init.size), &init.store, init.timeout, &what)?),
        };
        let mut tcp = GlooTcp {
            rank: init.rank,
            size: init.size,
            name: init.name.clone(),
            buffered: Default::default(),
            ctx,
            seqs: Mutex::new(Seqs {
                tag: 1,
                salt: 0,
                send: vec![0; n],
                recv: vec![0; n],
                tagged: Default::default(),
            }),
            closed: Default::default(),
            check_collectives: crate::config::config().check_collectives,
            peer_addresses: Vec::new(),
            options,
            reports,
        };
        tcp.hello(init.timeout)?;
        tcp.peer_addresses = tcp.exchange_addresses(init.timeout)?;
        crate::log_info!(
            "gloo: comm '{}' rank {}/{} connected (module {})",
            init.name,
            init.rank,
            init.size,
            module.path
        );
        Ok(tcp)
    }

    /// Every rank checks that its peers run the same module ABI and the same
    /// collective-check setting (a rank checking alone would desynchronise).
    fn hello(&self, timeout: Duration) -> Result<()> {
        let deadline = Deadline::after(timeout);
        let mine = [
            HELLO_MAGIC,
            self.check_collectives as u64,
            self.size as u64,
            0,
        ];
        let all = self.all_gather_words(&mine, &deadline, "connect")?;
        for (r, theirs) in all.chunks(4).enumerate() {
            if theirs[0] != HELLO_MAGIC || theirs[2] != self.size as u64 {
                return Err(Error::invalid_usage(format!(
                    "gloo: rank {r} runs an incompatible torchcomm gloo module"
                )));
            }
            if theirs[1] != mine[1] {
                return Err(Error::invalid_usage(format!(
                    "TORCHCOMM_CHECK_COLLECTIVES is {} on rank {} but {} on rank {r}: set it alike on every rank",
                    mine[1], self.rank, theirs[1]
                )));
            }
        }
        Ok(())
    }

    /// Every rank publishes the local address of each of its connections, so
    /// that a failure message naming an address can name the rank. (Gloo
    /// reports the listening address for connections this rank accepted
    /// from; the ephemeral port of a connection the peer initiated is not
    /// known, and such messages keep the bare address.)
    fn exchange_addresses(&self, timeout: Duration) -> Result<Vec<String>> {
        const WORDS: usize = 8; // 64 bytes per address
        let (n, me) = (self.size as usize, self.rank as usize);
        if n == 1 {
            return Ok(vec![String::new()]);
        }
        let mut mine = vec![0u64; n * WORDS];
        for j in (0..n).filter(|j| *j != me) {
            let a = self
                .ctx()
                .pair_address(j as i32)
                .map_err(|e| self.fail("connect", e))?;
            let bytes = a.as_bytes();
            let dst = unsafe {
                std::slice::from_raw_parts_mut(mine[j * WORDS..].as_mut_ptr() as *mut u8, WORDS * 8)
            };
            let len = bytes.len().min(WORDS * 8);
            dst[..len].copy_from_slice(&bytes[..len]);
        }
        let deadline = Deadline::after(timeout);
        let all = self.all_gather_words(&mine, &deadline, "connect")?;
        Ok((0..n)
            .map(|j| {
                let words = &all[(j * n + me) * WORDS..(j * n + me + 1) * WORDS];
                let bytes =
                    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, WORDS * 8) };
                let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
                String::from_utf8_lossy(&bytes[..end]).into_owned()
            })
            .collect())
    }
}
