//! Failures on the gloo backend with real processes: a rank killed mid-run,
//! a rank stopped under a short timeout, mismatched sizes caught before any
//! transfer, TORCHCOMM_CHECK_COLLECTIVES, and a missing Gloo module. No
//! survivor may hang, die of SIGPIPE or reach std::terminate.

mod gloo_common;

use gloo_common::*;
use std::time::{Duration, Instant};
use torchcomm::ErrorKind;
use torchcomm::{DType, ReduceOp};
use torchcomm::{Op, P2p};

/// Runs all_reduce in a loop until it fails; prints the failure and how long
/// the failing operation ran.
fn survive(comm: &torchcomm::Comm, count: usize) -> (ErrorKind, Duration, String) {
    let mut data = vec![1.0f32; count];
    for _ in 0..10_000 {
        let start = Instant::now();
        match run(
            comm,
            Op::all_reduce(ptr(&mut data), count, DType::F32, ReduceOp::SUM),
        ) {
            Ok(()) => {}
            Err(e) => return (e.kind, start.elapsed(), e.message),
        }
    }
    panic!("all_reduce never failed");
}

#[test]
fn gloo_peer_killed_mid_run() {
    const TIMEOUT: Duration = Duration::from_secs(5);
    if role().is_some() {
        // Rust programs start with SIGPIPE ignored; a C program does not.
        // Restore the default so that a stray SIGPIPE would kill us.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let comm = child_comm("killed", TIMEOUT);
        let me = comm.rank();
        if me == 2 {
            // Die in the middle of the traffic.
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            });
        }
        let (kind, took, msg) = survive(&comm, 1 << 20);
        println!("RESULT kind={kind:?} ms={} msg={msg}", took.as_millis());
        assert!(
            matches!(kind, ErrorKind::Remote | ErrorKind::Timeout),
            "{kind:?}: {msg}"
        );
        assert!(
            took < TIMEOUT + Duration::from_secs(1),
            "took {took:?}: {msg}"
        );
        assert!(msg.contains("all_reduce"), "{msg}");
        assert!(
            msg.contains("no failure report from rank 2 within"),
            "{msg}"
        );
        // Where Gloo's message names a peer by an address this rank can map
        // (not always: a connection's ephemeral port is unknown to it), the
        // rank is given.
        if let Some(p) = msg.find("peer rank ") {
            let named: i32 = msg[p + 10..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect::<String>()
                .parse()
                .unwrap();
            assert!(named != me, "{msg}");
        }
        // Survival did not come from ignoring SIGPIPE process-wide: the
        // disposition is still the default (the library never changes it).
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        unsafe { libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut sa) };
        assert_eq!(
            sa.sa_sigaction,
            libc::SIG_DFL,
            "SIGPIPE disposition changed"
        );
        // Later operations fail at once: the comm is aborted.
        let mut x = [1.0f32; 4];
        let start = Instant::now();
        let e = run(
            &comm,
            Op::all_reduce(ptr(&mut x), 4, DType::F32, ReduceOp::SUM),
        )
        .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
        assert!(comm.async_error().is_some());
        assert!(comm.finalize().is_err());
        // The survivors make a new comm and carry on.
        let again = child_comm_on(child_store(), "after-kill", me, 2, TIMEOUT).unwrap();
        let mut y = [me as f32 + 1.0; 8];
        run(
            &again,
            Op::all_reduce(ptr(&mut y), 8, DType::F32, ReduceOp::SUM),
        )
        .unwrap();
        assert_eq!(y, [3.0; 8]);
        again.finalize().unwrap();
        println!("RESULT recovered");
        return;
    }
    let start = Instant::now();
    let out = launch(
        "gloo_peer_killed_mid_run",
        "killed",
        3,
        &[],
        Duration::from_secs(60),
    );
    let all = || {
        out.iter()
            .map(|o| o.describe())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(out[2].signal(), Some(libc::SIGKILL), "{}", all());
    for o in &out[..2] {
        assert_ne!(
            o.signal(),
            Some(libc::SIGPIPE),
            "rank {} died of SIGPIPE: {}",
            o.rank,
            all()
        );
        assert!(o.ok(), "{}", all());
        assert_eq!(o.results().len(), 2, "{}", o.describe());
        eprintln!("rank {}: {:?}", o.rank, o.results());
    }
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn gloo_peer_stopped_times_out() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    if role().is_some() {
        let comm = child_comm("stopped", TIMEOUT);
        let hook_calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let calls = hook_calls.clone();
        comm.set_abort_hook(Some(Box::new(move |e| {
            calls.lock().unwrap().push((e.kind, e.message.clone()))
        })));
        run(&comm, Op::Barrier).unwrap();
        if comm.rank() == 2 {
            unsafe { libc::raise(libc::SIGSTOP) };
            return;
        }
        let (kind, took, msg) = survive(&comm, 1 << 16);
        println!("RESULT kind={kind:?} ms={} msg={msg}", took.as_millis());
        assert!(
            matches!(kind, ErrorKind::Remote | ErrorKind::Timeout),
            "{kind:?}: {msg}"
        );
        assert!(
            took < TIMEOUT + Duration::from_secs(1),
            "took {took:?}: {msg}"
        );
        // The survivors' reports in the store single out the stopped rank.
        assert!(
            msg.contains("no failure report from rank 2 within"),
            "{msg}"
        );
        // The flight recorder: the barrier completed, the all_reduce after
        // it is the one that failed, and its sequence number is the same on
        // both survivors (checked by the parent).
        let dump = comm.dump_flight_recorder();
        let rows: Vec<Vec<&str>> = dump
            .lines()
            .skip(2)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert!(
            dump.starts_with("flight recorder of comm 'stopped' (rank "),
            "{dump}"
        );
        assert_eq!(rows.len(), 2, "{dump}");
        assert_eq!(&rows[0][..2], ["1", "barrier"], "{dump}");
        assert!(dump.lines().nth(2).unwrap().contains("completed"), "{dump}");
        assert_eq!(
            &rows[1][..4],
            ["2", "all_reduce", "float32", "65536"],
            "{dump}"
        );
        let last = dump.lines().nth(3).unwrap();
        assert!(
            last.contains("timed out") || last.contains("failed"),
            "{dump}"
        );
        println!("RESULT failed_seq={}", rows[1][0]);
        // The abort hook ran once, with the failure that aborted the comm.
        let calls = hook_calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(calls[0].0, kind, "{calls:?}");
        assert!(
            calls[0].1.contains("no failure report from rank 2"),
            "{calls:?}"
        );
        comm.abort();
        assert_eq!(
            hook_calls.lock().unwrap().len(),
            1,
            "an abort of an aborted comm runs no hook"
        );
        return;
    }
    let out = launch_with(
        "gloo_peer_stopped_times_out",
        "stopped",
        3,
        &[],
        Duration::from_secs(60),
        |_, children| {
            // Once both survivors are done, end the stopped rank.
            let done = children[..2]
                .iter_mut()
                .all(|c| matches!(c.try_wait(), Ok(Some(_))));
            if done {
                let _ = children[2].kill();
            }
        },
    );
    for o in &out[..2] {
        assert!(o.ok(), "{}", o.describe());
        assert_eq!(o.results().len(), 2, "{}", o.describe());
        assert_eq!(o.results()[1], "failed_seq=2", "{}", o.describe());
        // The comm logged its flight recorder with the failure.
        assert!(
            o.stderr.contains("flight recorder of comm 'stopped'"),
            "{}",
            o.describe()
        );
        eprintln!("rank {}: {:?}", o.rank, o.results());
    }
}

/// The rank that hosts the store is the one stopped: the survivors still
/// fail within the timeout + 1 s, and say that the others' state is unknown
/// rather than waiting on the store.
#[test]
fn gloo_store_host_stopped_times_out() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    if role().is_some() {
        let me = rank();
        let port: u16 = std::env::var("TC_TEST_HOST_PORT").unwrap().parse().unwrap();
        let opts = if me == 0 {
            torchcomm::store::TcpStoreOptions::server(port, Duration::from_secs(30))
        } else {
            torchcomm::store::TcpStoreOptions::client("127.0.0.1", port, Duration::from_secs(30))
        };
        let store: torchcomm::store::StoreRef =
            std::sync::Arc::new(torchcomm::store::TcpStore::new(&opts).unwrap());
        let comm = child_comm_on(store, "host_stopped", me, 3, TIMEOUT).unwrap();
        run(&comm, Op::Barrier).unwrap();
        if me == 0 {
            unsafe { libc::raise(libc::SIGSTOP) };
            return;
        }
        let (kind, took, msg) = survive(&comm, 1 << 16);
        println!("RESULT kind={kind:?} ms={} msg={msg}", took.as_millis());
        assert!(
            matches!(kind, ErrorKind::Remote | ErrorKind::Timeout),
            "{kind:?}: {msg}"
        );
        assert!(
            took < TIMEOUT + Duration::from_secs(1),
            "took {took:?}: {msg}"
        );
        assert!(msg.contains("state is unknown"), "{msg}");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let env = [("TC_TEST_HOST_PORT", port.as_str())];
    let out = launch_with(
        "gloo_store_host_stopped_times_out",
        "host_stopped",
        3,
        &env,
        Duration::from_secs(60),
        |_, children| {
            let done = children[1..]
                .iter_mut()
                .all(|c| matches!(c.try_wait(), Ok(Some(_))));
            if done {
                let _ = children[0].kill();
            }
        },
    );
    for o in &out[1..] {
        assert!(o.ok(), "{}", o.describe());
        assert_eq!(o.results().len(), 1, "{}", o.describe());
        eprintln!("rank {}: {:?}", o.rank, o.results());
    }
}

#[test]
fn gloo_mismatched_sizes_fail_cleanly() {
    if role().is_some() {
        let store = child_store();
        let me = rank();
        let t = Duration::from_secs(10);
        // Point to point: 10 elements sent, 12 expected.
        let comm = child_comm_on(store.clone(), "p2p", me, 2, t).unwrap();
        let mut buf = vec![0f32; 12];
        let op = if me == 0 {
            Op::send(ptr(&mut buf), 10, DType::F32, 1, 0)
        } else {
            Op::recv(ptr(&mut buf), 12, DType::F32, 0, 0)
        };
        // The send is buffered and completes; the receive takes the
        // sender's descriptor first and fails, and nothing lands.
        if me == 0 {
            run(&comm, op).unwrap();
            println!("RESULT p2p sent");
        } else {
            let e = run(&comm, op).unwrap_err();
            println!("RESULT p2p {e}");
            assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
            assert!(e.message.contains("does not match"), "{e}");
            assert!(
                e.message.contains("10 float32") && e.message.contains("12 float32"),
                "{e}"
            );
            assert!(buf.iter().all(|x| *x == 0.0), "nothing landed");
        }
        // The receiver took the payload into scratch memory: the comm stays usable.
        let mut sum = vec![me as f32 + 1.0; 4];
        run(
            &comm,
            Op::all_reduce(ptr(&mut sum), 4, DType::F32, ReduceOp::SUM),
        )
        .unwrap();
        assert_eq!(sum, vec![3.0; 4]);
        // A batch where one transfer disagrees: the others still complete.
        let comm = child_comm_on(store.clone(), "batch", me, 2, t).unwrap();
        let mut a = vec![me + 1; 5];
        let mut b = vec![0i32; 5];
        let mut c = vec![0i32; 3];
        let peer = 1 - me;
        let ops = vec![
            P2p {
                is_send: true,
                buf: ptr(&mut a),
                count: 5,
                dtype: DType::I32,
                peer,
                tag: 0,
                source: None,
            },
            P2p {
                is_send: false,
                buf: ptr(&mut b),
                count: 5,
                dtype: DType::I32,
                peer,
                tag: 0,
                source: None,
            },
            P2p {
                is_send: me == 0,
                buf: ptr(&mut c),
                count: 3,
                dtype: if me == 0 { DType::I32 } else { DType::U32 },
                peer,
                tag: 0,
                source: None,
            },
        ];
        // Rank 0 sends the disagreeing transfer: its batch completes, rank
        // 1's fails naming both dtypes; the agreeing transfers complete.
        let result = run(&comm, Op::batch(ops));
        if me == 0 {
            result.unwrap();
        } else {
            let e = result.unwrap_err();
            assert!(
                e.message.contains("int32") && e.message.contains("uint32"),
                "{e}"
            );
            assert_eq!(c, vec![0; 3], "nothing landed");
        }
        assert_eq!(b, vec![peer + 1; 5]);
        // v-variants: ranks disagree on the counts.
        let comm = child_comm_on(store.clone(), "v", me, 2, t).unwrap();
        let counts = if me == 0 { vec![2, 3] } else { vec![2, 4] };
        let mut input = vec![0f64; 4];
        let mut output = vec![0f64; 6];
        let e = run(
            &comm,
            Op::all_gather_v(ptr(&mut output), ptr(&mut input), counts, DType::F64),
        )
        .unwrap_err();
        println!("RESULT v {e}");
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        assert!(
            e.message.contains("rank 1") && e.message.contains("counts"),
            "{e}"
        );
        let comm = child_comm_on(store.clone(), "a2av", me, 2, t).unwrap();
        let (ins, outs) = if me == 0 {
            (vec![1, 2], vec![1, 1])
        } else {
            (vec![1, 1], vec![1, 1])
        };
        let mut input = vec![0u8; 4];
        let mut output = vec![0u8; 4];
        let e = run(
            &comm,
            Op::all_to_all_v_single(ptr(&mut output), outs, ptr(&mut input), ins, DType::U8),
        )
        .unwrap_err();
        println!("RESULT a2av {e}");
        assert!(
            e.message
                .contains("rank 0 sends 2 elements to rank 1, which expects 1"),
            "{e}"
        );
        return;
    }
    // Gloo's point-to-point (like the shared-memory one, see
    // tests/gloo_shm_p2p.rs, it reports a mismatch on the receiver only).
    let out = launch(
        "gloo_mismatched_sizes_fail_cleanly",
        "mismatch",
        2,
        &[("TORCHCOMM_SHM_P2P", "0")],
        Duration::from_secs(60),
    );
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 3, "{}", o.describe());
        assert!(!o.stderr.contains("terminate"), "{}", o.describe());
    }
}

#[test]
fn gloo_check_collectives_reports_the_differing_rank() {
    if role().is_some() {
        assert!(torchcomm::config().check_collectives);
        let store = child_store();
        let me = rank();
        let t = Duration::from_secs(10);
        let comm = child_comm_on(store.clone(), "agree", me, 2, t).unwrap();
        let mut x = vec![1i64; 10];
        run(
            &comm,
            Op::all_reduce(ptr(&mut x), 10, DType::I64, ReduceOp::SUM),
        )
        .unwrap();
        assert_eq!(x, vec![2; 10]);
        let count = if me == 0 { 10 } else { 8 };
        let e = run(
            &comm,
            Op::all_reduce(ptr(&mut x), count, DType::I64, ReduceOp::SUM),
        )
        .unwrap_err();
        println!("RESULT count {e}");
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        let other = 1 - me;
        assert!(
            e.message.contains(&format!(
                "rank {other} called all_reduce(dtype int64, count {}",
                if me == 0 { 8 } else { 10 }
            )),
            "{e}"
        );
        let comm = child_comm_on(store.clone(), "ops", me, 2, t).unwrap();
        let op = if me == 0 {
            Op::broadcast(ptr(&mut x), 4, DType::I64, 0)
        } else {
            Op::all_reduce(ptr(&mut x), 4, DType::I64, ReduceOp::SUM)
        };
        let e = run(&comm, op).unwrap_err();
        println!("RESULT op {e}");
        assert!(
            e.message.contains("broadcast(") && e.message.contains("all_reduce("),
            "{e}"
        );
        let comm = child_comm_on(store, "roots", me, 2, t).unwrap();
        let e = run(&comm, Op::broadcast(ptr(&mut x), 4, DType::I64, me)).unwrap_err();
        println!("RESULT root {e}");
        assert!(
            e.message.contains("root 0") && e.message.contains("root 1"),
            "{e}"
        );
        return;
    }
    let out = launch(
        "gloo_check_collectives_reports_the_differing_rank",
        "check",
        2,
        &[("TORCHCOMM_CHECK_COLLECTIVES", "1")],
        Duration::from_secs(60),
    );
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 3, "{}", o.describe());
    }
}

#[test]
fn gloo_missing_module_is_unavailable() {
    if role().is_some() {
        let e = child_comm_on(child_store(), "nomodule", 0, 1, Duration::from_secs(5))
            .err()
            .unwrap();
        println!("RESULT {e}");
        assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
        assert!(e.message.contains("apt-get install libgloo-dev"), "{e}");
        // It names where it looked (here the one path the variable gave).
        assert!(
            e.message
                .contains("TORCHCOMM_GLOO_LIBRARY=/nonexistent/libtorchcomm-gloo.so"),
            "{e}"
        );
        return;
    }
    let out = launch(
        "gloo_missing_module_is_unavailable",
        "nomodule",
        1,
        &[(
            "TORCHCOMM_GLOO_LIBRARY",
            "/nonexistent/libtorchcomm-gloo.so",
        )],
        Duration::from_secs(30),
    );
    assert_all_ok(&out);
}

/// With abort-on-error on (the default), a peer's death aborts the surviving
/// process with a message naming the failure, instead of returning errors.
#[test]
fn gloo_abort_on_error_aborts_the_survivor() {
    if role().is_some() {
        let me = rank();
        let comm = torchcomm::Comm::new(
            "gloo",
            torchcomm::Device::Cpu,
            torchcomm::CommOptions {
                name: Some("aborting".into()),
                timeout: Some(Duration::from_secs(10)),
                abort_on_error: None, // the default: TORCHCOMM_ABORT_ON_ERROR, here 1
                rank: Some(me),
                world_size: Some(2),
                store: Some(child_store()),
                hints: Vec::new(),
            },
        )
        .unwrap();
        // The hook runs before the process aborts.
        comm.set_abort_hook(Some(Box::new(|e| {
            println!("RESULT hook kind={:?}", e.kind)
        })));
        let mut buf = vec![1f32; 1024];
        run(
            &comm,
            Op::all_reduce(ptr(&mut buf), 1024, DType::F32, ReduceOp::SUM),
        )
        .unwrap();
        if me == 1 {
            std::process::exit(0); // vanishes without finalizing
        }
        std::thread::sleep(Duration::from_millis(200));
        let r = run(
            &comm,
            Op::all_reduce(ptr(&mut buf), 1024, DType::F32, ReduceOp::SUM),
        );
        println!("RESULT survived {r:?}");
        return;
    }
    let out = launch(
        "gloo_abort_on_error_aborts_the_survivor",
        "abort",
        2,
        &[("TORCHCOMM_ABORT_ON_ERROR", "1")],
        Duration::from_secs(30),
    );
    assert!(out[1].ok(), "{}", out[1].describe());
    assert_eq!(
        out[0].signal(),
        Some(libc::SIGABRT),
        "{}",
        out[0].describe()
    );
    let results = out[0].results();
    assert_eq!(
        results.len(),
        1,
        "only the hook printed: {}",
        out[0].describe()
    );
    assert!(
        results[0] == "hook kind=Remote" || results[0] == "hook kind=Timeout",
        "{}",
        out[0].describe()
    );
    assert!(
        out[0].stderr.contains("aborting the process"),
        "{}",
        out[0].describe()
    );
    // Before aborting, the process logged its recent operations: the first
    // all_reduce completed, the second is the one that failed.
    let err = &out[0].stderr;
    let table = &err[err
        .find("flight recorder of comm 'aborting' (rank 0/2): last 2 of 2 operations")
        .unwrap_or_else(|| panic!("{}", out[0].describe()))..];
    let rows: Vec<&str> = table.lines().skip(2).take(2).collect();
    assert!(
        rows[0].trim_start().starts_with("1  all_reduce") && rows[0].contains("completed"),
        "{table}"
    );
    assert!(
        rows[1].trim_start().starts_with("2  all_reduce") && !rows[1].contains("completed"),
        "{table}"
    );
}
