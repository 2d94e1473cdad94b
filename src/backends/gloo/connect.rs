//! Creation: the Gloo context over the comm's store, the hello that agrees
//! on settings with every peer, and the exchange of peer addresses used to
//! name a failed peer.

use super::*;
use crate::backends::ucx::{self, UcxTransport};

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
            intra: None,
            hier: None,
            ucx: None,
            hostname,
            iface,
        };
        let mut backend = backend;
        backend.hello(init.timeout)?;
        backend.peer_addresses = backend.exchange_addresses(init.timeout)?;
        if init.size > 1 {
            backend.set_up_same_host_paths(&init)?;
            // On a hierarchical comm too: the operations the hierarchy does
            // not cover (point-to-point, gather, scatter, all_to_all) then go
            // over UCX among all ranks.
            if backend.intra.is_none() {
                backend.ucx = backend.host_transport(&init)?;
            }
        }
        crate::log_info!(
            "gloo: comm '{}' rank {}/{} connected (module {})",
            init.name,
            init.rank,
            init.size,
            module.path
        );
        Ok(backend)
    }

    /// The shared-memory path when every rank shares this host, else the
    /// hierarchical one when some do (collective).
    fn set_up_same_host_paths(&mut self, init: &BackendInit) -> Result<()> {
        let deadline = Deadline::after(init.timeout);
        let label = format!("gloo comm '{}' rank {}/{}", init.name, init.rank, init.size);
        let shm_p2p = hint(init, "gloo.shm_p2p").or_else(|| env("TORCHCOMM_SHM_P2P"));
        let backend = &*self;
        let intra = intra_host::IntraHost::setup(
            init.rank as usize,
            init.size as usize,
            &label,
            !shm_p2p.as_deref().is_some_and(intra_host::is_off),
            describe_fingerprint,
            &|words| backend.all_gather_words(words, &deadline, "connect (shared-memory setup)"),
        )?;
        self.intra = intra;
        if self.intra.is_none() {
            self.hier = hier::Hierarchy::setup(self, init)?;
        }
        Ok(())
    }

    /// UCX between hosts when every rank asks for it and loaded it, else
    /// none (Gloo), with an INFO line saying why (collective).
    fn host_transport(&self, init: &BackendInit) -> Result<Option<UcxTransport>> {
        let wanted = ucx::wanted(hint(init, "gloo.host_transport").as_deref())?;
        let opened =
            wanted.then(|| UcxTransport::open(init.rank, init.size, &init.name, init.timeout));
        let d = Deadline::after(init.timeout);
        let mine = [wanted as u64, matches!(opened, Some(Ok(_))) as u64];
        let all = self.all_gather_words(&mine, &d, "connect (host transport)")?;
        let label = format!("gloo comm '{}' rank {}/{}", init.name, init.rank, init.size);
        let not = |w: usize| all.chunks(2).position(|r| r[w] == 0);
        let fallback = match (not(0), not(1), &opened) {
            (Some(_), _, None) => return Ok(None),
            (Some(r), _, Some(_)) => format!("rank {r} does not ask for UCX"),
            (None, _, Some(Err(e))) => format!("UCX is unavailable here: {}", e.message),
            (None, Some(r), _) => format!("UCX is unavailable on rank {r}"),
            (None, None, _) => String::new(),
        };
        if !fallback.is_empty() {
            crate::log_info!(
                "{label}: the host transport ucx was asked for but {fallback}; using Gloo between hosts"
            );
            return Ok(None);
        }
        let Some(Ok(u)) = opened else {
            return Ok(None);
        };
        u.connect(&init.store, &d)?;
        crate::log_info!("{label}: {} between hosts", u.version());
        Ok(Some(u))
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

/// The comm's hint `k`, if the creator gave one.
fn hint(init: &BackendInit, k: &str) -> Option<String> {
    init.hints
        .iter()
        .find(|(key, _)| key == k)
        .map(|(_, v)| v.clone())
}

/// Environment variable `k`, unless unset or empty.
fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
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
