//! Which transport serves each operation of a host comm, decided in one
//! table when the comm is created, as NCCL picks among its transports.
//!
//! The table lists the comm's transports in order of preference; an
//! operation goes to the first that carries it (see
//! [`Transport`]: a transport answers `None` for a member it does not
//! carry, from the operation alone, so every rank picks alike):
//!
//! | order | transport | set up when | carries |
//! |---|---|---|---|
//! | 1 | hierarchy | the comm spans hosts and some host has several ranks (not `TORCHCOMM_GLOO_HIER=0` / hint `gloo.hier=0` on any rank) | the collectives of even blocks: shared memory inside each host, the leaders' flat transport between hosts |
//! | 2 | shared memory | every rank on this host (not `TORCHCOMM_GLOO_SHM=0` on any rank) | every collective; point-to-point unless `TORCHCOMM_SHM_P2P=0` / hint `gloo.shm_p2p=0` on any rank |
//! | 3 | UCX | not every rank on this host, and every rank asks for it (`TORCHCOMM_HOST_TRANSPORT=ucx`, or the hint `gloo.host_transport`, which wins) and loaded it | every operation |
//! | 4 | Gloo over TCP | always | every operation, and refusals through the store |
//!
//! The switches are the table's inputs; each is agreed among the ranks
//! when its transport is set up (one rank's "off" keeps it off for all).
//! The table is logged at INFO once per comm.

use super::failure::FailureReports;
use super::hier::Hierarchy;
use super::shared_memory::{is_off, SharedMemory};
use super::tcp::GlooTcp;
use crate::backends::transport::{offer, Call, Transport};
use crate::backends::ucx::{self, UcxTransport};
use crate::backends::BackendInit;
use crate::error::{Error, Result};
use crate::op::{AllToAll, Gather, P2p, Reduction, Refusal, Scatter};
use crate::util::Deadline;
use std::sync::Arc;

/// The comm's transports, in order of preference.
pub(super) struct Routes {
    hierarchy: Option<Hierarchy>,
    shared_memory: Option<SharedMemory>,
    ucx: Option<Arc<UcxTransport>>,
    /// Always there: it sets the others up, and carries what they do not.
    tcp: GlooTcp,
}

impl Routes {
    /// Sets up the transports this comm can use, Gloo over TCP first (its
    /// collectives set up the others), and logs the table (collective).
    pub(super) fn connect(init: &BackendInit, reports: Arc<FailureReports>) -> Result<Routes> {
        let tcp = GlooTcp::connect(init, reports)?;
        let mut routes = Routes {
            hierarchy: None,
            shared_memory: None,
            ucx: None,
            tcp,
        };
        let gloo = &routes.tcp;
        if init.size > 1 {
            let label = label(init);
            let deadline = Deadline::after(init.timeout);
            let shm_p2p = init.setting("gloo.shm_p2p", "TORCHCOMM_SHM_P2P");
            routes.shared_memory = SharedMemory::setup(
                init.rank as usize,
                init.size as usize,
                &label,
                !shm_p2p.as_deref().is_some_and(is_off),
                &|words| gloo.all_gather_words(words, &deadline, "connect (shared-memory setup)"),
            )?;
            if routes.shared_memory.is_none() {
                let hier = init.setting("gloo.hier", "TORCHCOMM_GLOO_HIER");
                let wanted = !hier.as_deref().is_some_and(is_off);
                routes.hierarchy = Hierarchy::setup(gloo, init, wanted, &connect_group)?;
                // On a hierarchical comm too: the operations the hierarchy
                // does not carry then go over UCX among all ranks.
                routes.ucx = host_transport(gloo, init)?.map(Arc::new);
            }
        }
        crate::log_info!("{}: transports: {}", label(init), routes.describe());
        Ok(routes)
    }

    /// The table, in order of preference (Gloo over TCP last).
    fn order(&self) -> [Option<&dyn Transport>; 4] {
        [
            self.hierarchy.as_ref().map(|t| t as &dyn Transport),
            self.shared_memory.as_ref().map(|t| t as &dyn Transport),
            self.ucx.as_deref().map(|t| t as &dyn Transport),
            Some(&self.tcp),
        ]
    }

    /// Runs `call` on the first transport that carries it, in the order
    /// of [`Routes::order`] (spelled out here so that each transport's
    /// family methods inline into the call's path).
    ///
    /// # Safety
    /// As for the family methods of [`Transport`].
    #[inline(always)]
    pub(super) unsafe fn run(&self, call: &Call) -> Result<()> {
        if let Some(t) = &self.hierarchy {
            if let Some(result) = run_on(t, call) {
                return result;
            }
        }
        if let Some(t) = &self.shared_memory {
            if let Some(result) = run_on(t, call) {
                return result;
            }
        }
        if let Some(t) = self.ucx.as_deref() {
            if let Some(result) = run_on(t, call) {
                return result;
            }
        }
        match run_on(&self.tcp, call) {
            Some(result) => result,
            None => Err(Error::unsupported(format!(
                "no transport of this comm carries {}",
                call.op.name()
            ))),
        }
    }

    /// Wakes or fails every transport's waits: the comm broke (`why`).
    pub(super) fn abort(&self, why: &Error) {
        for t in self.order().into_iter().flatten() {
            t.abort(why);
        }
    }

    /// The table as the comm's log line tells it.
    fn describe(&self) -> String {
        let rows: Vec<String> = self
            .order()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, t)| format!("{}. {}: {}", i + 1, t.name(), t.carries()))
            .collect();
        format!(
            "{} (an operation goes to the first that carries it)",
            rows.join("; ")
        )
    }

    pub(super) fn ucx(&self) -> Option<&Arc<UcxTransport>> {
        self.ucx.as_ref()
    }

    pub(super) fn tcp(&self) -> &GlooTcp {
        &self.tcp
    }

    /// The transport among all the table's ranks when they span hosts.
    fn between_hosts(&self) -> &'static str {
        match self.ucx {
            Some(_) => "UCX",
            None => "Gloo (TCP)",
        }
    }
}

/// A hierarchical group's own table (see [`Hierarchy`]), and its
/// transport between hosts.
fn connect_group(init: &BackendInit) -> Result<(Box<dyn Transport>, &'static str)> {
    let routes = Routes::connect(init, Arc::new(FailureReports::new(init)))?;
    let between = routes.between_hosts();
    Ok((Box::new(routes), between))
}

/// A table is a transport that carries what any of its transports does
/// (every operation: Gloo over TCP is last): how a hierarchy runs its
/// steps on its groups' tables.
impl Transport for Routes {
    fn name(&self) -> &'static str {
        "transport table"
    }

    fn carries(&self) -> String {
        self.describe()
    }

    unsafe fn reduction(&self, _: &Reduction, call: &Call) -> Option<Result<()>> {
        Some(self.run(call))
    }

    unsafe fn gather(&self, _: &Gather, call: &Call) -> Option<Result<()>> {
        Some(self.run(call))
    }

    unsafe fn scatter(&self, _: &Scatter, call: &Call) -> Option<Result<()>> {
        Some(self.run(call))
    }

    unsafe fn all_to_all(&self, _: &AllToAll, call: &Call) -> Option<Result<()>> {
        Some(self.run(call))
    }

    fn barrier(&self, call: &Call) -> Option<Result<()>> {
        // SAFETY: a barrier carries no buffer.
        Some(unsafe { self.run(call) })
    }

    unsafe fn point_to_point(&self, _: &[P2p], call: &Call) -> Option<Result<()>> {
        Some(self.run(call))
    }

    fn refuse(&self, _: &Refusal, call: &Call) -> Option<Result<()>> {
        // SAFETY: a refusal carries no buffer.
        Some(unsafe { self.run(call) })
    }

    fn abort(&self, why: &Error) {
        Routes::abort(self, why)
    }
}

/// `call` on `t`, or `None` when `t` does not carry it; a failure that
/// leaves this rank out of step with its peers breaks the comm.
///
/// # Safety
/// As for the family methods of [`Transport`].
#[inline(always)]
unsafe fn run_on<T: Transport>(t: &T, call: &Call) -> Option<Result<()>> {
    let result = offer(t, call)?;
    if let Err(e) = &result {
        if !t.keeps_step(e.kind) {
            (call.out_of_step)(e)
        }
    }
    Some(result)
}

/// UCX between hosts when every rank asks for it and loaded it, else
/// none (Gloo), with an INFO line saying why (collective).
fn host_transport(gloo: &GlooTcp, init: &BackendInit) -> Result<Option<UcxTransport>> {
    let wanted = ucx::wanted(init.hint("gloo.host_transport"))?;
    let opened = wanted.then(|| UcxTransport::open(init.rank, init.size, &init.name, init.timeout));
    let d = Deadline::after(init.timeout);
    let mine = [wanted as u64, matches!(opened, Some(Ok(_))) as u64];
    let all = gloo.all_gather_words(&mine, &d, "connect (host transport)")?;
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
            "{}: the host transport ucx was asked for but {fallback}; using Gloo between hosts",
            label(init)
        );
        return Ok(None);
    }
    let Some(Ok(u)) = opened else {
        return Ok(None);
    };
    u.connect(&init.store, &d)?;
    crate::log_info!("{}: {} between hosts", label(init), u.version());
    Ok(Some(u))
}

fn label(init: &BackendInit) -> String {
    format!("gloo comm '{}' rank {}/{}", init.name, init.rank, init.size)
}
