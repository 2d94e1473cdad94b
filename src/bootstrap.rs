//! Bootstrap from the environment: rank, world size and local rank from
//! explicit values or the launcher's variables, and the store at
//! `MASTER_ADDR:MASTER_PORT` when none was given.

use crate::error::{Error, Result};
use crate::store::server::ServerOptions;
use crate::store::{StoreRef, TcpStore, TcpStoreOptions, TcpStoreServer};
use crate::util::lock;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Store servers this process hosts for `MASTER_ADDR:MASTER_PORT`, by port.
/// Every comm bootstrapped on that port shares one, and it is kept until the
/// process exits: the next comm's peers may reach it after this process
/// destroyed its last comm, so stopping it then would strand them (or let
/// them join a server about to vanish).
static HOSTED: Mutex<Vec<(u16, Arc<TcpStoreServer>)>> = Mutex::new(Vec::new());

/// The server hosted on `port`, started (listening on `addr`'s interface,
/// not every interface) by the first comm that needs it.
fn hosted_server(addr: &str, port: u16, token: Option<Vec<u8>>) -> Result<Arc<TcpStoreServer>> {
    let mut hosted = lock(&HOSTED);
    if let Some((_, s)) = hosted.iter().find(|(p, _)| *p == port) {
        return Ok(s.clone());
    }
    let server = Arc::new(TcpStoreServer::start_with(&ServerOptions {
        bind: Some(addr.to_string()),
        port,
        token,
        reply_timeout: None,
    })?);
    hosted.push((port, server.clone()));
    Ok(server)
}

/// Where a process stands in its job.
pub struct Bootstrap {
    pub rank: i32,
    pub world_size: i32,
    pub local_rank: i32,
    /// The job's store; when this process hosts the server, the server lives
    /// as long as this reference (and its clones).
    pub store: StoreRef,
}

/// Variables consulted, first match wins: ours, Open MPI, PMI, torchrun,
/// Slurm (last: a launcher started inside a Slurm step, torchrun or
/// mpirun, sets its own variables while the step's stay inherited).
pub const RANK_VARS: [&str; 5] = [
    "TORCHCOMM_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "RANK",
    "SLURM_PROCID",
];
pub const SIZE_VARS: [&str; 5] = [
    "TORCHCOMM_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "WORLD_SIZE",
    "SLURM_NTASKS",
];
pub const LOCAL_RANK_VARS: [&str; 5] = [
    "TORCHCOMM_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "LOCAL_RANK",
    "SLURM_LOCALID",
];

/// Under Slurm, the value of `MASTER_ADDR` or `MASTER_PORT` when unset: the
/// first host of `SLURM_STEP_NODELIST` (where task 0 runs), else
/// `SLURM_LAUNCH_NODE_IPADDR`; the port 10000 + (`SLURM_JOB_ID` +
/// `SLURM_STEP_ID`) % 50000, the same on every task of the step.
fn slurm_default(lookup: &dyn Fn(&str) -> Option<String>, var: &str) -> Option<String> {
    match var {
        "MASTER_ADDR" => {
            let first_host = lookup("SLURM_STEP_NODELIST").and_then(|list| {
                // "node[07-09,12],gpu1": the first item, its first number.
                let mut depth = 0;
                let mut items = list.split(|c| {
                    depth += (c == '[') as i32 - (c == ']') as i32;
                    c == ',' && depth == 0
                });
                let item = items.next()?.trim().to_string();
                let host = match (item.find('['), item.find(']')) {
                    (Some(open), Some(close)) if open < close => {
                        let first = item[open + 1..close].split([',', '-']).next()?;
                        format!("{}{}{}", &item[..open], first, &item[close + 1..])
                    }
                    _ => item,
                };
                Some(host).filter(|h| !h.is_empty())
            });
            first_host.or_else(|| lookup("SLURM_LAUNCH_NODE_IPADDR"))
        }
        "MASTER_PORT" => {
            let job: u64 = lookup("SLURM_JOB_ID")?.trim().parse().ok()?;
            let step: u64 = lookup("SLURM_STEP_ID")
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            Some((10000 + (job + step) % 50000).to_string())
        }
        _ => None,
    }
}

fn lookup_int(lookup: &dyn Fn(&str) -> Option<String>, vars: &[&str]) -> Result<Option<i32>> {
    for v in vars {
        if let Some(s) = lookup(v) {
            let n: i32 = s.trim().parse().map_err(|_| {
                Error::invalid_argument(format!("environment variable {v}={s:?} is not an integer"))
            })?;
            return Ok(Some(n));
        }
    }
    Ok(None)
}

/// [`from_lookup`] with the process environment.
pub fn from_environment(
    explicit_rank: Option<i32>,
    explicit_size: Option<i32>,
    explicit_store: Option<StoreRef>,
    timeout: Duration,
) -> Result<Bootstrap> {
    from_lookup(
        &|k| std::env::var(k).ok(),
        explicit_rank,
        explicit_size,
        explicit_store,
        timeout,
    )
}

/// This process's rank among its host's processes, from the launcher's
/// variables, when it set one.
pub fn local_rank_from_environment() -> Result<Option<i32>> {
    lookup_int(&|k| std::env::var(k).ok(), &LOCAL_RANK_VARS)
}

/// Resolves rank, size, local rank and store, reading variables through
/// `lookup` (injectable for tests).
pub fn from_lookup(
    lookup: &dyn Fn(&str) -> Option<String>,
    explicit_rank: Option<i32>,
    explicit_size: Option<i32>,
    explicit_store: Option<StoreRef>,
    timeout: Duration,
) -> Result<Bootstrap> {
    let rank = match explicit_rank {
        Some(r) => r,
        None => lookup_int(lookup, &RANK_VARS)?.ok_or_else(|| {
            Error::invalid_usage(format!(
                "cannot determine the rank: no rank was given and none of {} is set",
                RANK_VARS.join(", ")
            ))
        })?,
    };
    let world_size = match explicit_size {
        Some(s) => s,
        None => lookup_int(lookup, &SIZE_VARS)?.ok_or_else(|| {
            Error::invalid_usage(format!(
                "cannot determine the world size: no size was given and none of {} is set",
                SIZE_VARS.join(", ")
            ))
        })?,
    };
    if world_size <= 0 {
        return Err(Error::invalid_argument(format!(
            "world size must be positive, not {world_size}"
        )));
    }
    if rank < 0 || rank >= world_size {
        return Err(Error::invalid_argument(format!(
            "rank {rank} is outside [0, {world_size})"
        )));
    }
    let local_rank = lookup_int(lookup, &LOCAL_RANK_VARS)?.unwrap_or(rank);
    let store = match explicit_store {
        Some(s) => s,
        None => store_from_env(lookup, rank, world_size, timeout)?,
    };
    Ok(Bootstrap {
        rank,
        world_size,
        local_rank,
        store,
    })
}

/// The TCP store at `MASTER_ADDR:MASTER_PORT` (Slurm's variables stand
/// in); rank 0 hosts it unless a launcher's agent store does
/// (`TORCHELASTIC_USE_AGENT_STORE=True`).
fn store_from_env(
    lookup: &dyn Fn(&str) -> Option<String>,
    rank: i32,
    world_size: i32,
    timeout: Duration,
) -> Result<StoreRef> {
    let need = |v: &str| {
        lookup(v)
            .or_else(|| slurm_default(lookup, v))
            .ok_or_else(|| {
                Error::invalid_usage(format!(
                    "environment variable {v} is not set (needed to find the store; under \
                 Slurm, SLURM_STEP_NODELIST and SLURM_JOB_ID stand in)"
                ))
            })
    };
    let addr = need("MASTER_ADDR")?;
    let port_s = need("MASTER_PORT")?;
    let port: u16 = port_s.trim().parse().map_err(|_| {
        Error::invalid_argument(format!(
            "environment variable MASTER_PORT={port_s:?} is not a port number"
        ))
    })?;
    let agent = lookup("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True");
    let hosts = !agent && rank == 0;
    let token = lookup("TORCHCOMM_STORE_TOKEN").filter(|t| !t.is_empty());
    let token = token.map(String::into_bytes);
    let server = match hosts {
        true => Some(hosted_server(&addr, port, token.clone())?),
        false => None,
    };
    let opts = TcpStoreOptions {
        host: addr,
        port,
        is_server: hosts,
        world_size: Some(world_size as u32),
        wait_for_workers: true,
        timeout,
        token,
    };
    let store: StoreRef = Arc::new(TcpStore::with_server(&opts, server)?);
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn dummy_store() -> StoreRef {
        let dir = std::env::temp_dir().join(format!(
            "tc-boot-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        Arc::new(crate::store::FileStore::new(dir, 1, Duration::from_secs(1)).unwrap())
    }

    #[test]
    fn explicit_values_win() {
        let e = env(&[("RANK", "3"), ("WORLD_SIZE", "8")]);
        let b = from_lookup(
            &e,
            Some(1),
            Some(2),
            Some(dummy_store()),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!((b.rank, b.world_size, b.local_rank), (1, 2, 1));
    }

    #[test]
    fn precedence_torchcomm_then_ompi_then_pmi_then_torchrun() {
        let all = [
            ("TORCHCOMM_RANK", "1"),
            ("TORCHCOMM_SIZE", "10"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "20"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "5"),
            ("PMI_RANK", "3"),
            ("PMI_SIZE", "30"),
            ("RANK", "4"),
            ("WORLD_SIZE", "40"),
            ("LOCAL_RANK", "7"),
        ];
        let b = from_lookup(
            &env(&all),
            None,
            None,
            Some(dummy_store()),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!((b.rank, b.world_size, b.local_rank), (1, 10, 5));
        let b = from_lookup(
            &env(&all[2..]),
            None,
            None,
            Some(dummy_store()),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!((b.rank, b.world_size), (2, 20));
        let b = from_lookup(
            &env(&all[5..]),
            None,
            None,
            Some(dummy_store()),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!((b.rank, b.world_size, b.local_rank), (3, 30, 7));
        let b = from_lookup(
            &env(&all[7..]),
            None,
            None,
            Some(dummy_store()),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!((b.rank, b.world_size, b.local_rank), (4, 40, 7));
    }

    #[test]
    fn missing_variables_are_named() {
        let err = from_lookup(
            &env(&[]),
            None,
            Some(2),
            Some(dummy_store()),
            Duration::from_secs(1),
        )
        .err()
        .unwrap();
        assert!(
            err.message.contains("TORCHCOMM_RANK") && err.message.contains("RANK"),
            "{}",
            err.message
        );
        let err = from_lookup(
            &env(&[("RANK", "0")]),
            None,
            None,
            Some(dummy_store()),
            Duration::from_secs(1),
        )
        .err()
        .unwrap();
        assert!(err.message.contains("WORLD_SIZE"), "{}", err.message);
        let err = from_lookup(
            &env(&[("RANK", "0"), ("WORLD_SIZE", "1")]),
            None,
            None,
            None,
            Duration::from_secs(1),
        )
        .err()
        .unwrap();
        assert!(err.message.contains("MASTER_ADDR"), "{}", err.message);
        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
        ]);
        let err = from_lookup(&e, None, None, None, Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(err.message.contains("MASTER_PORT"), "{}", err.message);
        let err = from_lookup(
            &env(&[("RANK", "x")]),
            None,
            Some(1),
            None,
            Duration::from_secs(1),
        )
        .err()
        .unwrap();
        assert!(err.message.contains("RANK=\"x\""), "{}", err.message);
        let err = from_lookup(
            &env(&[]),
            Some(2),
            Some(2),
            Some(dummy_store()),
            Duration::from_secs(1),
        )
        .err()
        .unwrap();
        assert!(err.message.contains("outside"), "{}", err.message);
    }

    #[test]
    fn rank0_hosts_the_store_and_others_join() {
        // Find a free port, then let "rank 0" host on it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let vars = move |rank: &'static str| {
            let p = port.to_string();
            move |k: &str| match k {
                "RANK" => Some(rank.to_string()),
                "WORLD_SIZE" => Some("2".into()),
                "MASTER_ADDR" => Some("127.0.0.1".into()),
                "MASTER_PORT" => Some(p.clone()),
                _ => None,
            }
        };
        let t = std::thread::spawn(move || {
            from_lookup(&vars("0"), None, None, None, Duration::from_secs(20)).map(|b| b.store)
        });
        let b1 = from_lookup(&vars("1"), None, None, None, Duration::from_secs(20)).unwrap();
        let s0 = t.join().unwrap().unwrap();
        s0.set("k", b"v").unwrap();
        assert_eq!(b1.store.get("k").unwrap(), b"v");
        assert_eq!(s0.num_keys().unwrap(), 2, "init/ and k");
    }

    #[test]
    fn slurm_gives_rank_size_and_local_rank_after_the_others() {
        let slurm = [
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
        ];
        let boot = |pairs: &[(&str, &str)]| {
            let b = from_lookup(
                &env(pairs),
                None,
                None,
                Some(dummy_store()),
                Duration::from_secs(1),
            )
            .unwrap();
            (b.rank, b.world_size, b.local_rank)
        };
        assert_eq!(boot(&slurm), (2, 4, 1));
        // torchrun (or mpirun) inside a Slurm step: its variables win.
        let mut both = slurm.to_vec();
        both.extend([("RANK", "0"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "3")]);
        assert_eq!(boot(&both), (0, 8, 3));
        let mut ompi = slurm.to_vec();
        ompi.extend([("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "5")]);
        assert_eq!(boot(&ompi).0, 3);
        assert_eq!(boot(&ompi).1, 5);
        let err = from_lookup(
            &env(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "2")]),
            None,
            None,
            Some(dummy_store()),
            Duration::from_secs(1),
        )
        .err()
        .unwrap();
        assert!(
            err.message.contains("SLURM_PROCID=\"x\""),
            "{}",
            err.message
        );
    }

    #[test]
    fn slurm_master_from_the_step_nodelist_then_the_launch_node() {
        let addr = |pairs: &[(&str, &str)]| slurm_default(&env(pairs), "MASTER_ADDR");
        let list = |l: &str| addr(&[("SLURM_STEP_NODELIST", l)]);
        assert_eq!(list("node[07-09,12],gpu1").as_deref(), Some("node07"));
        assert_eq!(list("node[12,07-09]").as_deref(), Some("node12"));
        assert_eq!(list("gpu1,node[1-2]").as_deref(), Some("gpu1"));
        assert_eq!(list("rack[3-4]-n1").as_deref(), Some("rack3-n1"));
        assert_eq!(list("localhost").as_deref(), Some("localhost"));
        let launch = ("SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3");
        assert_eq!(addr(&[launch]).as_deref(), Some("10.1.2.3"));
        assert_eq!(
            addr(&[launch, ("SLURM_STEP_NODELIST", "n[4-5]")]).as_deref(),
            Some("n4")
        );
        assert_eq!(addr(&[]), None);
        let port = |pairs: &[(&str, &str)]| slurm_default(&env(pairs), "MASTER_PORT");
        assert_eq!(port(&[("SLURM_JOB_ID", "1234")]).as_deref(), Some("11234"));
        let step = [("SLURM_JOB_ID", "99999"), ("SLURM_STEP_ID", "3")];
        assert_eq!(port(&step).as_deref(), Some("10002"));
        assert_eq!(port(&[("SLURM_JOB_ID", "abc")]), None);
        assert_eq!(port(&[]), None);
    }

    #[test]
    fn master_addr_and_port_win_over_slurm() {
        // Rank 1 only connects: MASTER_* point at a closed port on
        // 127.0.0.1, the Slurm values at a host that does not resolve, so the
        // error names which one was used.
        let e = env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_NODELIST", "no-such-host.invalid"),
            ("SLURM_JOB_ID", "5"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "1"),
        ]);
        let err = from_lookup(&e, None, None, None, Duration::from_millis(300))
            .err()
            .unwrap();
        assert!(err.message.contains("127.0.0.1:1"), "{}", err.message);
        let slurm_only = env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_NODELIST", "no-such-host.invalid"),
            ("SLURM_JOB_ID", "5"),
        ]);
        let err = from_lookup(&slurm_only, None, None, None, Duration::from_millis(300))
            .err()
            .unwrap();
        assert!(
            err.message.contains("no-such-host.invalid:10005"),
            "{}",
            err.message
        );
    }
}
