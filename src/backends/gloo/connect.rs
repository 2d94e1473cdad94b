//! Creation: the Gloo context over the comm's store, the hello that agrees
//! on settings with every peer, and the exchange of peer addresses used to
//! name a failed peer.

use super::routes::{env, hint, Routes};
use super::*;

impl GlooBackend {
    pub(super) fn connect(init: BackendInit) -> Result<GlooBackend> {
        let module = shim::module()?;
        let check = crate::config::config().check_collectives;
        let n = init.size as usize;
        let hostname = hint(&init, "gloo.hostname").or_else(|| env("TORCHCOMM_GLOO_HOSTNAME"));
        let iface = hint(&init, "gloo.iface")
            .or_else(|| env("TORCHCOMM_GLOO_IFACE"))
            .or_else(|| env("GLOO_SOCKET_IFNAME"));
        let ctx = connect_context(module, &init, hostname.as_deref(), iface.as_deref())?;
        let backend = GlooBackend {
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
            broken: Mutex::new(None),
            check_collectives: check,
            peer_addresses: Vec::new(),
            store: init.store.clone(),
            ops_run: AtomicU64::new(0),
            diagnosed: AtomicBool::new(false),
            refusals: AtomicU64::new(0),
            windows_made: AtomicU64::new(0),
            shared_memory: Default::default(),
            routes: Routes::default(),
            hostname,
            iface,
        };
        let mut backend = backend;
        backend.hello(init.timeout)?;
        backend.peer_addresses = backend.exchange_addresses(init.timeout)?;
        backend.routes = Routes::connect(&backend, &init)?;
        crate::log_info!(
            "gloo: comm '{}' rank {}/{} connected (module {})",
            init.name,
            init.rank,
            init.size,
            module.path
        );
        Ok(backend)
    }

    /// Every rank checks that its peers run the same module ABI and the same
    /// collective-check setting (a rank checking alone would desynchronise).
    pub(super) fn hello(&self, timeout: Duration) -> Result<()> {
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
    pub(super) fn exchange_addresses(&self, timeout: Duration) -> Result<Vec<String>> {
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

/// The comm's Gloo context over its store; none for one rank (collective).
fn connect_context(
    module: &'static shim::Module,
    init: &BackendInit,
    hostname: Option<&str>,
    iface: Option<&str>,
) -> Result<Option<shim::Context>> {
    if init.size <= 1 {
        return Ok(None);
    }
    let store: StoreRef = init.store.clone();
    let vt = shim::StoreVtable {
        user: &store as *const StoreRef as *mut c_void,
        set: store_set,
        get: store_get,
        wait: store_wait,
    };
    let ctx = shim::Context::new(
        module,
        init.rank,
        init.size,
        &vt,
        init.timeout,
        hostname,
        iface,
    )
    .map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "gloo: connecting rank {} of {} for comm '{}': {}",
                init.rank, init.size, init.name, e.message
            ),
        )
    })?;
    Ok(Some(ctx))
}
