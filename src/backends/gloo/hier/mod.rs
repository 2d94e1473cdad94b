//! Hierarchical collectives for a gloo comm that spans hosts: inside each
//! host through shared memory, between hosts through one leader per host
//! over Gloo.
//!
//! At creation, when the shared-memory path could not be set up for the
//! whole comm, the ranks all-gather their host identity (see
//! [`super::shm::host_id`]: boot id, network namespace and hostname, or
//! `TORCHCOMM_HOST_ID`). If they form more than one host and some host has
//! several ranks, every rank joins two groups, each with a transport table
//! of its own, over the comm's store under its own prefix (the comm's table
//! connects them: [`ConnectGroup`]; to the hierarchy each is a
//! [`Transport`]):
//!
//! - `hier/host<h>`: the ranks of host `h` (numbered in their comm order),
//!   whose table has shared memory as a single-host comm's does;
//! - `hier/leaders`: the first rank of every host (the leader), hosts
//!   numbered in the order of their lowest rank, whose table has the
//!   transport between hosts (UCX where every leader asks for it, else
//!   Gloo over TCP).
//!
//! A step runs on its group's table with the comm's own `Call` (deadline,
//! liveness, and what breaks the comm), so a failed step breaks the comm
//! and, through it, both tables.
//!
//! The collectives of [`ops`] compose steps of those two (e.g. all_reduce is
//! a local reduce to the leader, an all_reduce among leaders and a local
//! broadcast), so only the leaders move data between hosts. Every other
//! operation (all_to_all, gather, scatter, the v-forms, point-to-point,
//! windows) and float16/bfloat16 sums (whose flat path rounds once) keep
//! the flat path: UCX or Gloo among all ranks. `TORCHCOMM_GLOO_HIER=0` or the hint
//! `gloo.hier=0` on any rank keeps the whole comm flat.

mod ops;

use super::tcp::GlooTcp;
use crate::backends::transport::Transport;
use crate::backends::BackendInit;
use crate::error::Result;
use crate::store::prefix::PrefixStore;
use crate::util::Deadline;
use std::sync::Arc;

/// This rank's part in the hierarchy.
pub(super) struct Hierarchy {
    /// The ranks of this host: their table, this rank's number in it, their
    /// count.
    local: Box<dyn Transport>,
    local_rank: i32,
    local_size: i32,
    /// The leaders of every host; on leaders only.
    leaders: Option<Box<dyn Transport>>,
    /// The leaders' transport between hosts, as the log names it.
    between_hosts: &'static str,
    /// The comm ranks of each host, hosts in the order of their lowest rank.
    hosts: Vec<Vec<usize>>,
    /// (host, index within that host) of every comm rank.
    place: Vec<(usize, usize)>,
    rank: usize,
}

/// Connects a group's own transport table (collective over the group's
/// ranks, described by the `BackendInit`): the table as a transport, and
/// the name of its transport between hosts.
pub(super) type ConnectGroup<'a> =
    &'a dyn Fn(&BackendInit) -> Result<(Box<dyn Transport>, &'static str)>;

/// Words each rank publishes: whether it wants the hierarchy, its host.
const OFFER: usize = 3;

/// Groups ranks by host identity: the hosts' rank lists, in the order of
/// their lowest rank, or None when an identity is unknown.
fn group_by_host(ids: &[[u64; 2]]) -> Option<Vec<Vec<usize>>> {
    let mut hosts: Vec<([u64; 2], Vec<usize>)> = Vec::new();
    for (r, id) in ids.iter().enumerate() {
        if *id == [0, 0] {
            return None;
        }
        match hosts.iter_mut().find(|(h, _)| h == id) {
            Some((_, ranks)) => ranks.push(r),
            None => hosts.push((*id, vec![r])),
        }
    }
    Some(hosts.into_iter().map(|(_, ranks)| ranks).collect())
}

impl Hierarchy {
    /// Collective over `flat` (the comm's own Gloo context): decides with
    /// every rank whether the comm is hierarchical (`wanted`: this rank's
    /// switch) and, if so, connects this rank's two groups. None: the comm
    /// stays flat.
    pub(super) fn setup(
        flat: &GlooTcp,
        init: &BackendInit,
        wanted: bool,
        connect_group: ConnectGroup,
    ) -> Result<Option<Hierarchy>> {
        let id = super::shm::host_id();
        let deadline = Deadline::after(init.timeout);
        let all = flat.all_gather_words(
            &[wanted as u64, id[0], id[1]],
            &deadline,
            "connect (host grouping)",
        )?;
        let offers: Vec<&[u64]> = all.chunks(OFFER).collect();
        let label = format!("gloo comm '{}' rank {}/{}", init.name, init.rank, init.size);
        let ids: Vec<[u64; 2]> = offers.iter().map(|o| [o[1], o[2]]).collect();
        let Some(hosts) = group_by_host(&ids) else {
            crate::log_info!("{label}: a rank's host is unknown; every operation uses Gloo");
            return Ok(None);
        };
        if hosts.len() == 1 || hosts.len() == ids.len() {
            return Ok(None); // one host, or one rank per host: nothing to gain
        }
        if !offers.iter().all(|o| o[0] == 1) {
            crate::log_info!(
                "{label}: {} hosts, hierarchical collectives off (TORCHCOMM_GLOO_HIER=0 or hint gloo.hier=0 on some rank)",
                hosts.len()
            );
            return Ok(None);
        }
        let mut place = vec![(0, 0); ids.len()];
        for (h, ranks) in hosts.iter().enumerate() {
            for (j, r) in ranks.iter().enumerate() {
                place[*r] = (h, j);
            }
        }
        let rank = init.rank as usize;
        let (host, index) = place[rank];
        let sub = |prefix: String, r: usize, n: usize| {
            let mut hints = init.hints.clone();
            hints.retain(|(k, _)| k != "gloo.hier");
            hints.push(("gloo.hier".into(), "0".into()));
            let child = BackendInit {
                rank: r as i32,
                size: n as i32,
                name: format!("{}/{prefix}", init.name),
                store: Arc::new(PrefixStore::new(&prefix, init.store.clone())),
                hints,
                ..init.clone()
            };
            connect_group(&child)
        };
        let local_size = hosts[host].len();
        let (local, _) = sub(format!("hier/host{host}"), index, local_size)?;
        let (leaders, between_hosts) = match index {
            0 => {
                let (l, between) = sub("hier/leaders".into(), host, hosts.len())?;
                (Some(l), between)
            }
            _ => (None, "the leaders' own transport"),
        };
        crate::log_info!(
            "{label}: hierarchical collectives on: {} hosts of {:?} ranks; this rank is {} of host {host}",
            hosts.len(),
            hosts.iter().map(Vec::len).collect::<Vec<_>>(),
            if index == 0 { "the leader" } else { "a member" },
        );
        Ok(Some(Hierarchy {
            local,
            local_rank: index as i32,
            local_size: local_size as i32,
            leaders,
            between_hosts,
            hosts,
            place,
            rank,
        }))
    }

    /// The transport among the hosts' leaders, as this rank knows it.
    fn leaders_transport(&self) -> &'static str {
        self.between_hosts
    }

    /// Makes both groups' transports fail their operations now (the comm
    /// broke or was aborted).
    pub(super) fn abort_all(&self, err: &crate::error::Error) {
        self.local.abort(err);
        if let Some(l) = &self.leaders {
            l.abort(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_group_in_order_of_their_lowest_rank() {
        let (a, b, c) = ([1, 1], [2, 2], [3, 3]);
        assert_eq!(
            group_by_host(&[b, a, b, c, a]).unwrap(),
            vec![vec![0, 2], vec![1, 4], vec![3]]
        );
        assert!(group_by_host(&[a, [0, 0]]).is_none(), "unknown host");
    }
}
