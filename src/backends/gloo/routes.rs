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
//! | 3 | UCX | every rank loaded it, no rank says `gloo` (`TORCHCOMM_HOST_TRANSPORT`, or the hint `gloo.host_transport`, which wins), and the ranks span hosts or every rank says `ucx` | every operation when every rank says `ucx`; else point-to-point and the collectives up to `TORCHCOMM_UCX_LARGEST` bytes (8 MiB) |
//! | 4 | Gloo over TCP | always | every operation, and refusals through the store |
//!
//! The switches are the table's inputs; each is agreed among the ranks
//! when its transport is set up (one rank's "off" keeps it off for all).
//! The table is logged at INFO once per comm.

use super::failure::FailureReports;
use super::hier::Hierarchy;
use super::shared_memory::{is_off, SharedMemory};
use super::shm::host_id;
use super::tcp::GlooTcp;
use crate::backends::transport::{offer, Call, Transport};
use crate::backends::ucx::{self, HostChoice, UcxTransport};
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

    /// Shared memory, when it carries point-to-point (it comes before every
    /// transport that does).
    #[inline]
    pub(super) fn shared_memory_p2p(&self) -> Option<&SharedMemory> {
        self.shared_memory.as_ref().filter(|s| s.has_p2p())
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

/// UCX between hosts where the ranks' settings agree on it (see
/// [`between_hosts`]) and every rank loaded it, else none (Gloo), with an
/// INFO line saying why where a rank asked for UCX (collective).
fn host_transport(gloo: &GlooTcp, init: &BackendInit) -> Result<Option<UcxTransport>> {
    let choice = ucx::wanted(init.hint("gloo.host_transport"))?;
    let largest = ucx::largest(init.setting("gloo.ucx_largest", "TORCHCOMM_UCX_LARGEST"))?;
    let host = host_id();
    let d = Deadline::after(init.timeout);
    let mine = [choice.word(), host[0], host[1], largest];
    let said = gloo.all_gather_words(&mine, &d, "connect (host transport)")?;
    let largest = match between_hosts(&said) {
        BetweenHosts::Ucx { largest } => largest,
        BetweenHosts::Gloo { refused_by } => {
            if let (HostChoice::Ucx, Some(r)) = (choice, refused_by) {
                log_gloo_instead(init, choice, &format!("rank {r} does not ask for UCX"));
            }
            return Ok(None);
        }
    };
    let opened = UcxTransport::open(init.rank, init.size, &init.name, init.timeout);
    let all = gloo.all_gather_words(&[opened.is_ok() as u64], &d, "connect (UCX)")?;
    let u = match (opened, all.iter().position(|w| *w == 0)) {
        (Ok(u), None) => u.carrying_up_to(largest),
        (Err(e), _) => {
            log_gloo_instead(
                init,
                choice,
                &format!("UCX is unavailable here: {}", e.message),
            );
            return Ok(None);
        }
        (Ok(_), Some(r)) => {
            log_gloo_instead(init, choice, &format!("UCX is unavailable on rank {r}"));
            return Ok(None);
        }
    };
    u.connect(&init.store, &d)?;
    crate::log_info!("{}: {} between hosts", label(init), u.version());
    Ok(Some(u))
}

fn log_gloo_instead(init: &BackendInit, choice: HostChoice, why: &str) {
    let asked = match choice {
        HostChoice::Ucx => "the host transport ucx was asked for",
        _ => "UCX is the default between hosts",
    };
    crate::log_info!(
        "{}: {asked} but {why}; using Gloo between hosts",
        label(init)
    );
}

/// What the ranks' settings decide between hosts.
#[derive(Debug, PartialEq, Eq)]
enum BetweenHosts {
    /// Gloo only; `refused_by`: the first rank whose setting says gloo (or,
    /// on one host, leaves the choice to the default).
    Gloo { refused_by: Option<usize> },
    /// UCX, carrying collectives up to `largest` bytes (None: every size).
    Ucx { largest: Option<usize> },
}

/// The ranks' agreement from their words (choice, host id's two words,
/// largest collective by default): one rank's `gloo` keeps UCX off; every
/// rank's `ucx` puts every operation on it; otherwise (some rank left the
/// choice to the default) UCX carries point-to-point and the collectives
/// up to the smallest rank's largest size, when the ranks span hosts (an
/// unknown host, all zeros, counts as its own), and on one host (shared
/// memory switched off) Gloo stays.
fn between_hosts(said: &[u64]) -> BetweenHosts {
    let ranks: Vec<&[u64]> = said.chunks(4).collect();
    let choice = |r: &[u64]| HostChoice::from_word(r[0]);
    if let Some(r) = ranks.iter().position(|r| choice(r) == HostChoice::Gloo) {
        return BetweenHosts::Gloo {
            refused_by: Some(r),
        };
    }
    if ranks.iter().all(|r| choice(r) == HostChoice::Ucx) {
        return BetweenHosts::Ucx { largest: None };
    }
    let one_host = ranks
        .iter()
        .all(|r| r[1..3] == ranks[0][1..3] && r[1..3] != [0, 0]);
    if one_host {
        let by_default = ranks.iter().position(|r| choice(r) == HostChoice::Auto);
        return BetweenHosts::Gloo {
            refused_by: by_default,
        };
    }
    let largest = ranks.iter().map(|r| r[3]).min().unwrap_or(0);
    BetweenHosts::Ucx {
        largest: Some(usize::try_from(largest).unwrap_or(usize::MAX)),
    }
}

fn label(init: &BackendInit) -> String {
    format!("gloo comm '{}' rank {}/{}", init.name, init.rank, init.size)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GLOO: u64 = 0;
    const UCX: u64 = 1;
    const AUTO: u64 = 2;

    /// The words of ranks given as (choice, host, largest).
    fn said(ranks: &[(u64, u64, u64)]) -> Vec<u64> {
        ranks
            .iter()
            .flat_map(|&(c, h, l)| [c, h, h * 7, l])
            .collect()
    }

    #[test]
    fn one_ranks_gloo_keeps_ucx_off() {
        let s = said(&[(UCX, 1, 8), (GLOO, 2, 8), (AUTO, 3, 8)]);
        assert_eq!(
            between_hosts(&s),
            BetweenHosts::Gloo {
                refused_by: Some(1)
            }
        );
    }

    #[test]
    fn every_ranks_ucx_carries_every_size_even_on_one_host() {
        let s = said(&[(UCX, 1, 8), (UCX, 1, 8)]);
        assert_eq!(between_hosts(&s), BetweenHosts::Ucx { largest: None });
    }

    #[test]
    fn the_default_across_hosts_is_ucx_up_to_the_smallest_limit() {
        let s = said(&[(AUTO, 1, 64), (UCX, 2, 8), (AUTO, 2, 16)]);
        assert_eq!(between_hosts(&s), BetweenHosts::Ucx { largest: Some(8) });
    }

    #[test]
    fn the_default_on_one_host_is_gloo() {
        let s = said(&[(UCX, 1, 8), (AUTO, 1, 8)]);
        assert_eq!(
            between_hosts(&s),
            BetweenHosts::Gloo {
                refused_by: Some(1)
            }
        );
        let s = said(&[(AUTO, 1, 8), (AUTO, 1, 8)]);
        assert_eq!(
            between_hosts(&s),
            BetweenHosts::Gloo {
                refused_by: Some(0)
            }
        );
    }

    #[test]
    fn unknown_hosts_count_as_hosts_of_their_own() {
        let s = said(&[(AUTO, 0, 8), (AUTO, 0, 8)]);
        assert_eq!(between_hosts(&s), BetweenHosts::Ucx { largest: Some(8) });
    }

    #[test]
    fn the_settings_are_read_with_their_names_in_errors() {
        assert_eq!(ucx::wanted(Some("UCX")).unwrap(), HostChoice::Ucx);
        assert_eq!(ucx::wanted(Some("auto")).unwrap(), HostChoice::Auto);
        let e = ucx::wanted(Some("rdma")).unwrap_err();
        assert!(e.message.contains("gloo.host_transport") && e.message.contains("rdma"));
        assert_eq!(ucx::largest(Some(" 1024 ".into())).unwrap(), 1024);
        assert_eq!(ucx::largest(None).unwrap(), ucx::DEFAULT_LARGEST as u64);
        let e = ucx::largest(Some("8M".into())).unwrap_err();
        assert!(e.message.contains("TORCHCOMM_UCX_LARGEST") && e.message.contains("8M"));
    }
}
