//! `Comm::shrink` (`tc_comm_shrink`) on the gloo backend with real
//! processes: survivors of one or two ranks killed mid all_reduce make a
//! comm of the rest and reduce correctly on it; survivors passing different
//! exclusion lists fail with `TC_ERR_INVALID_USAGE` naming the rank that
//! differs (and succeed once they agree); a healthy comm shrinks (twice,
//! then splits) with the parent still usable; bad arguments are refused
//! before any communication; and a dead store host makes the shrink fail
//! with the store's error rather than hang.

mod gloo_common;

use gloo_common::*;
use std::sync::Arc;
use std::time::Duration;
use torchcomm::ErrorKind;
use torchcomm::{Comm, CommOptions, Op};
use torchcomm::{DType, ReduceOp};

/// The parent's operation timeout: a survivor learns of the death within
/// it (usually at once, from a closed connection).
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// The shrink's: long enough for the slowest survivor to see the failure,
/// on a loaded machine.
const SHRINK_TIMEOUT: Duration = Duration::from_secs(40);
const LIMIT: Duration = Duration::from_secs(150);

fn shrink_opts() -> CommOptions {
    CommOptions {
        timeout: Some(SHRINK_TIMEOUT),
        ..Default::default()
    }
}

fn all_reduce(comm: &Comm, data: &mut [f32]) -> torchcomm::Result<()> {
    run(
        comm,
        Op::all_reduce(ptr(data), data.len(), DType::F32, ReduceOp::SUM),
    )
}

/// Kills this process `after` from now (a rank that dies mid-traffic).
fn die_after(after: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    });
}

/// all_reduce in a loop until it fails (a peer died); returns the error.
fn until_failure(comm: &Comm) -> torchcomm::Error {
    let mut data = vec![1.0f32; 1 << 18];
    for _ in 0..100_000 {
        if let Err(e) = all_reduce(comm, &mut data) {
            return e;
        }
    }
    panic!("all_reduce never failed");
}

/// Checks the shrunk comm of `survivors` (parent ranks): its rank, size and
/// parent ranks, an all_reduce of (parent rank + 1) and an all_gather of
/// the parent ranks in the new order.
fn check_shrunk(child: &Comm, parent_rank: i32, survivors: &[i32]) {
    let me = survivors.iter().position(|r| *r == parent_rank).unwrap();
    assert_eq!(child.rank(), me as i32);
    assert_eq!(child.size(), survivors.len() as i32);
    // The parent is a root comm: its numbering is the root's.
    assert_eq!(child.root_ranks(), survivors);
    let count = 1000;
    let mut x = vec![parent_rank as f32 + 1.0; count];
    all_reduce(child, &mut x).unwrap();
    let want: f32 = survivors.iter().map(|r| *r as f32 + 1.0).sum();
    assert!(x.iter().all(|v| *v == want), "got {}, want {want}", x[0]);
    let mut mine = [parent_rank];
    let mut all = vec![-1i32; survivors.len()];
    run(
        child,
        Op::all_gather_single(ptr(&mut all), ptr(&mut mine), 1, DType::I32),
    )
    .unwrap();
    assert_eq!(all, survivors, "the new ranks keep the parent's order");
}

/// The children's part of the kill tests: `victims` die mid all_reduce;
/// the others see the failure, shrink, and reduce on the new comm.
fn survive_kill(victims: &[i32]) {
    let comm = child_comm("parent", OP_TIMEOUT);
    let me = comm.rank();
    if victims.contains(&me) {
        die_after(Duration::from_millis(300));
    }
    let e = until_failure(&comm);
    println!("RESULT failed kind={:?}", e.kind);
    assert!(
        matches!(e.kind, ErrorKind::Remote | ErrorKind::Timeout),
        "{e}"
    );
    let survivors: Vec<i32> = (0..comm.size()).filter(|r| !victims.contains(r)).collect();
    // The list in another order than the other survivors': only the set
    // counts.
    let mut exclude = victims.to_vec();
    if me % 2 == 1 {
        exclude.reverse();
    }
    let child = comm.shrink(&exclude, "shrunk", shrink_opts()).unwrap();
    check_shrunk(&child, me, &survivors);
    child.finalize().unwrap();
    assert!(comm.finalize().is_err(), "the parent stays failed");
    println!("RESULT shrunk");
}

/// Launches 4 ranks of `test` and checks that `victims` were killed and the
/// others shrank.
fn launch_kill(test: &str, victims: &[i32], env: &[(&str, &str)]) {
    let out = launch(test, "kill", 4, env, LIMIT);
    let all = out
        .iter()
        .map(|o| o.describe())
        .collect::<Vec<_>>()
        .join("\n");
    for o in &out {
        if victims.contains(&(o.rank as i32)) {
            assert_eq!(o.signal(), Some(libc::SIGKILL), "{all}");
        } else {
            assert!(o.ok(), "{all}");
            assert_eq!(o.results().len(), 2, "{all}");
        }
    }
}

#[test]
fn gloo_shrink_after_one_rank_killed() {
    if role().is_some() {
        return survive_kill(&[2]);
    }
    launch_kill("gloo_shrink_after_one_rank_killed", &[2], &[]);
}

/// The same over Gloo's TCP transport (no shared-memory collectives).
#[test]
fn gloo_shrink_after_one_rank_killed_tcp() {
    if role().is_some() {
        return survive_kill(&[1]);
    }
    launch_kill(
        "gloo_shrink_after_one_rank_killed_tcp",
        &[1],
        &[("TORCHCOMM_GLOO_SHM", "0")],
    );
}

#[test]
fn gloo_shrink_after_two_ranks_killed() {
    if role().is_some() {
        return survive_kill(&[1, 3]);
    }
    launch_kill("gloo_shrink_after_two_ranks_killed", &[1, 3], &[]);
}

#[test]
fn gloo_shrink_with_differing_lists_fails_clearly() {
    if role().is_some() {
        let comm = child_comm("parent", OP_TIMEOUT);
        let me = comm.rank();
        if me == 3 {
            // Leaves without calling shrink (as if dead).
            return;
        }
        // Ranks 0 and 1 exclude rank 3; rank 2 excludes 1 and 3.
        let exclude: &[i32] = if me == 2 { &[1, 3] } else { &[3] };
        let e = comm
            .shrink(exclude, "shrunk", shrink_opts())
            .map(|_| ())
            .unwrap_err();
        println!("RESULT kind={:?} msg={}", e.kind, e.message);
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        let differing = if me == 2 { "rank 0" } else { "rank 2" };
        assert!(e.message.contains(differing), "{e}");
        if me == 1 {
            assert!(e.message.contains("excludes this rank"), "{e}");
        }
        // Once they agree, the shrink works.
        let child = comm.shrink(&[3], "agreed", shrink_opts()).unwrap();
        check_shrunk(&child, me, &[0, 1, 2]);
        child.finalize().unwrap();
        comm.finalize().unwrap();
        return;
    }
    let out = launch(
        "gloo_shrink_with_differing_lists_fails_clearly",
        "differ",
        4,
        &[],
        LIMIT,
    );
    assert_all_ok(&out);
    for o in &out[..3] {
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

#[test]
fn gloo_shrink_healthy_comm_then_split() {
    if role().is_some() {
        let comm = child_comm("parent", OP_TIMEOUT);
        let me = comm.rank();
        // Refused before any communication.
        let refused = |exclude: &[i32], kind: ErrorKind, text: &str| {
            let e = comm
                .shrink(exclude, "bad", shrink_opts())
                .map(|_| ())
                .unwrap_err();
            assert_eq!(e.kind, kind, "{e}");
            assert!(e.message.contains(text), "{e}");
        };
        refused(&[3], ErrorKind::InvalidArgument, "outside [0, 3)");
        refused(&[-1], ErrorKind::InvalidArgument, "outside [0, 3)");
        let other = (me + 1) % 3;
        refused(&[other, other], ErrorKind::InvalidArgument, "appears twice");
        refused(&[me], ErrorKind::InvalidUsage, "is excluded");
        refused(&[0, 1, 2], ErrorKind::InvalidUsage, "is excluded");
        let e = comm
            .shrink(&[], "a/b", shrink_opts())
            .map(|_| ())
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        // Rank 0 drops out of a healthy comm.
        let without_0: Option<Arc<Comm>> =
            (me != 0).then(|| comm.shrink(&[0], "without0", shrink_opts()).unwrap());
        if let Some(c) = &without_0 {
            check_shrunk(c, me, &[1, 2]);
        }
        // The parent still works, for every rank.
        let mut x = [me as f32; 4];
        all_reduce(&comm, &mut x).unwrap();
        assert_eq!(x, [3.0; 4]);
        // A second shrink (nobody excluded) and a split of the same parent
        // meet no keys of the first.
        let all = comm.shrink(&[], "all", shrink_opts()).unwrap();
        check_shrunk(&all, me, &[0, 1, 2]);
        let split = comm
            .split(&[2, 1, 0], "split", CommOptions::default())
            .unwrap()
            .unwrap();
        assert_eq!(split.rank(), 2 - me);
        assert_eq!(split.root_ranks(), [2, 1, 0]);
        let mut y = [1.0f32; 4];
        all_reduce(&split, &mut y).unwrap();
        assert_eq!(y, [3.0; 4]);
        for c in without_0.iter().chain([&all, &split]) {
            c.finalize().unwrap();
        }
        comm.finalize().unwrap();
        println!("RESULT ok");
        return;
    }
    let out = launch(
        "gloo_shrink_healthy_comm_then_split",
        "healthy",
        3,
        &[],
        LIMIT,
    );
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

/// When the rank that hosts the store dies, the store goes with it: the
/// survivors' shrink fails (not hangs) with the store's error and the hint
/// that the store host must survive.
#[test]
fn gloo_shrink_without_the_store_host_fails_clearly() {
    if role().is_some() {
        let me = rank();
        let port: u16 = std::env::var("TC_TEST_HOST_PORT").unwrap().parse().unwrap();
        let opts = if me == 0 {
            torchcomm::store::TcpStoreOptions::server(port, Duration::from_secs(30))
        } else {
            torchcomm::store::TcpStoreOptions::client("127.0.0.1", port, Duration::from_secs(30))
        };
        let store: torchcomm::store::StoreRef =
            Arc::new(torchcomm::store::TcpStore::new(&opts).unwrap());
        let comm = child_comm_on(store, "parent", me, 3, OP_TIMEOUT).unwrap();
        if me == 0 {
            die_after(Duration::from_millis(300));
        }
        until_failure(&comm);
        let e = comm
            .shrink(&[0], "shrunk", shrink_opts())
            .map(|_| ())
            .unwrap_err();
        println!("RESULT kind={:?} msg={}", e.kind, e.message);
        assert!(e.message.contains("store is unreachable"), "{e}");
        assert!(e.message.contains("must outlive"), "{e}");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let out = launch(
        "gloo_shrink_without_the_store_host_fails_clearly",
        "hostdied",
        3,
        &[("TC_TEST_HOST_PORT", port.as_str())],
        LIMIT,
    );
    out[0].assert_killed();
    for o in &out[1..] {
        assert!(o.ok(), "{}", o.describe());
        assert_eq!(o.results().len(), 1, "{}", o.describe());
        eprintln!("rank {}: {:?}", o.rank, o.results());
    }
}
