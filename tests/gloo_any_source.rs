//! Receives from any source (`TC_ANY_SOURCE`) with real processes of 2, 3
//! and 4 ranks, on each host transport that carries point-to-point:
//! shared memory (every rank on this host), Gloo over TCP
//! (`TORCHCOMM_GLOO_SHM=0`) and UCX over TCP loopback
//! (`TORCHCOMM_HOST_TRANSPORT=ucx`; SKIPPED where libucp.so.0 is missing).
//! Every peer sends to rank 0, which takes each message from whichever
//! rank comes first and checks the sender it is told against the payload;
//! two messages of one peer come in its order; a receive with one tag
//! never takes another tag's message; a size mismatch names the sender and
//! leaves the comm usable; messages larger than a ring; batches refuse it;
//! a peer killed while rank 0 waits is named long before the timeout.

mod gloo_common;
mod ucx_common;

use gloo_common::*;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::time::{Duration, Instant};
use torchcomm::{Comm, DType, ErrorKind, Op, OpOptions, P2p, Ptr, ANY_SOURCE};

const TIMEOUT: Duration = Duration::from_secs(60);

fn ptr(v: &mut [i32]) -> Ptr {
    Ptr(v.as_mut_ptr() as *mut c_void)
}

fn send(comm: &Comm, v: &mut [i32], peer: i32, tag: u32) {
    run(comm, Op::send(ptr(v), v.len(), DType::I32, peer, tag)).unwrap();
}

/// A blocking receive from any source: the sender, or the error.
fn recv_any(comm: &Comm, v: &mut [i32], tag: u32) -> torchcomm::Result<i32> {
    let (op, source) = Op::recv_any(ptr(v), v.len(), DType::I32, tag);
    run(comm, op)?;
    Ok(source
        .get()
        .expect("a completed any-source receive tells its sender"))
}

/// The same, started (`async_op`) and waited for.
fn recv_any_async(comm: &Comm, v: &mut [i32], tag: u32) -> i32 {
    let (op, source) = Op::recv_any(ptr(v), v.len(), DType::I32, tag);
    let opts = OpOptions {
        async_op: true,
        ..Default::default()
    };
    let w = comm.submit(op, &opts).unwrap();
    w.wait_blocking().unwrap();
    source.get().unwrap()
}

fn transport_comm() -> std::sync::Arc<Comm> {
    let comm = child_comm("any-source", TIMEOUT);
    let version = comm.backend_version().to_string_lossy().into_owned();
    let ucx = std::env::var("TORCHCOMM_HOST_TRANSPORT").is_ok_and(|v| v == "ucx");
    assert_eq!(version.contains("UCX"), ucx, "{version}");
    comm
}

/// Rank 0 receives from any source; the others send. Every check of the
/// file's header but the killed peer.
fn child_exchanges() {
    let comm = transport_comm();
    let (me, n) = (comm.rank(), comm.size());
    let others = n - 1;
    if me == 0 {
        // One message each, tag 5: each sender told once, with its payload.
        let mut seen = BTreeMap::new();
        for k in 0..others {
            let mut v = [-1i32];
            let from = match k % 2 {
                0 => recv_any(&comm, &mut v, 5).unwrap(),
                _ => recv_any_async(&comm, &mut v, 5),
            };
            assert_eq!(v[0], from, "payload of the message told as rank {from}'s");
            *seen.entry(from).or_insert(0) += 1;
        }
        let expected: BTreeMap<i32, i32> = (1..n).map(|q| (q, 1)).collect();
        assert_eq!(seen, expected, "every sender exactly once");

        // Two messages per peer, tag 6: each peer's in its order.
        let mut next = vec![0; n as usize];
        for _ in 0..2 * others {
            let mut v = [-1i32; 2];
            let from = recv_any(&comm, &mut v, 6).unwrap();
            assert_eq!(v[0], from);
            assert_eq!(
                v[1], next[from as usize],
                "rank {from}'s messages out of order"
            );
            next[from as usize] += 1;
        }

        // Tag selection: the peers sent tag 3 first, then tag 7.
        for _ in 0..others {
            let mut v = [-1i32];
            let from = recv_any(&comm, &mut v, 7).unwrap();
            assert_eq!(
                v[0],
                700 + from,
                "a tag-7 receive took another tag's message"
            );
        }
        for _ in 0..others {
            let mut v = [-1i32];
            let from = recv_any(&comm, &mut v, 3).unwrap();
            assert_eq!(v[0], 300 + from);
        }

        // A size mismatch: rank 1 sends 3 elements, the receive wants 2.
        let mut v = [0i32; 2];
        let e = recv_any(&comm, &mut v, 9).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        assert!(
            e.message.contains("rank 1") && e.message.contains("3 int32"),
            "the mismatch names the sender and its send: {e}"
        );
        assert!(e.message.contains("2 int32"), "{e}");

        // Messages larger than a shared-memory ring (1 MiB), every peer
        // at once.
        let mut seen = Vec::new();
        for _ in 0..others {
            let mut big = vec![-1i32; 300_000];
            let from = recv_any(&comm, &mut big, 11).unwrap();
            assert!(
                big.iter().all(|x| *x == from),
                "large message of rank {from}"
            );
            seen.push(from);
        }
        seen.sort_unstable();
        assert_eq!(seen, (1..n).collect::<Vec<_>>());

        // A batch refuses it, naming the entry.
        let mut v = [0i32];
        let member = P2p {
            is_send: false,
            buf: ptr(&mut v),
            count: 1,
            dtype: DType::I32,
            peer: ANY_SOURCE,
            tag: 0,
            source: None,
        };
        let e = run(&comm, Op::batch(vec![member])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
        assert!(e.message.contains("batch[0].peer"), "{e}");
    } else {
        let mut v = [me];
        send(&comm, &mut v, 0, 5);
        for k in 0..2 {
            let mut v = [me, k];
            send(&comm, &mut v, 0, 6);
        }
        send(&comm, &mut [300 + me], 0, 3);
        send(&comm, &mut [700 + me], 0, 7);
        if me == 1 {
            send(&comm, &mut [1, 1, 1], 0, 9);
        }
        let mut big = vec![me; 300_000];
        send(&comm, &mut big, 0, 11);
    }
    // The comm still works after the mismatch.
    run(&comm, Op::Barrier).unwrap();
    println!("RESULT ok");
}

/// Rank 1 is killed while rank 0 waits in a receive from any source (the
/// other ranks never send): rank 0 fails naming it, well before its 30 s
/// timeout. Over Gloo TCP (`DEAD_PEER_TIMES_OUT`), whose receive from a
/// set of ranks is not failed by one pair's loss, it fails at its (5 s)
/// timeout instead: never a hang.
fn child_dead_peer() {
    let times_out = std::env::var("DEAD_PEER_TIMES_OUT").is_ok();
    let limit = match times_out {
        true => Duration::from_secs(5),
        false => Duration::from_secs(30),
    };
    let comm = child_comm("any-source-dead", limit);
    run(&comm, Op::Barrier).unwrap();
    match comm.rank() {
        0 => {
            let began = Instant::now();
            let mut v = [0i32];
            let e = recv_any(&comm, &mut v, 0).unwrap_err();
            let took = began.elapsed();
            println!(
                "RESULT kind={:?} ms={} msg={}",
                e.kind,
                took.as_millis(),
                e.message
            );
            if times_out {
                assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
                assert!(took >= limit - Duration::from_millis(100), "{took:?}: {e}");
                return;
            }
            assert_eq!(e.kind, ErrorKind::Remote, "{e}");
            assert!(e.message.contains("rank 1"), "{e}");
            assert!(took < Duration::from_secs(10), "seen after {took:?}: {e}");
        }
        1 => {
            std::thread::sleep(Duration::from_millis(500));
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        _ => {
            // Stays alive (not a peer that could be named) until rank 0
            // is done.
            std::thread::sleep(Duration::from_secs(12));
            println!("RESULT idle");
        }
    }
}

const SHM: &[(&str, &str)] = &[];
const TCP: &[(&str, &str)] = &[("TORCHCOMM_GLOO_SHM", "0")];
const TCP_DEAD: &[(&str, &str)] = &[("TORCHCOMM_GLOO_SHM", "0"), ("DEAD_PEER_TIMES_OUT", "1")];

fn exchanges(test: &str, n: usize, env: &[(&str, &str)]) {
    let out = launch(test, "exchanges", n, env, Duration::from_secs(240));
    assert_all_ok(&out);
    for o in &out[..1] {
        assert_eq!(o.results(), vec!["ok".to_string()], "{}", o.describe());
    }
}

fn dead_peer(test: &str, n: usize, env: &[(&str, &str)]) {
    let out = launch(test, "dead", n, env, Duration::from_secs(90));
    out[1].assert_killed();
    for o in out.iter().filter(|o| o.rank != 1) {
        assert!(o.ok(), "{}", o.describe());
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

/// One test per line: `name: job, ranks, environment`.
macro_rules! any_source_tests {
    ($($name:ident: $job:ident, $n:literal, $env:expr, $needs_ucx:literal;)*) => {$(
        #[test]
        fn $name() {
            match role().as_deref() {
                Some("exchanges") => return child_exchanges(),
                Some("dead") => return child_dead_peer(),
                Some(_) => return,
                None => {}
            }
            if $needs_ucx && ucx_common::ucx_missing() {
                return;
            }
            $job(stringify!($name), $n, $env)
        }
    )*};
}

any_source_tests! {
    any_source_shm_2: exchanges, 2, SHM, false;
    any_source_shm_3: exchanges, 3, SHM, false;
    any_source_shm_4: exchanges, 4, SHM, false;
    any_source_tcp_2: exchanges, 2, TCP, false;
    any_source_tcp_3: exchanges, 3, TCP, false;
    any_source_tcp_4: exchanges, 4, TCP, false;
    any_source_ucx_2: exchanges, 2, ucx_common::LOOPBACK_ENV, true;
    any_source_ucx_3: exchanges, 3, ucx_common::LOOPBACK_ENV, true;
    any_source_ucx_4: exchanges, 4, ucx_common::LOOPBACK_ENV, true;
    any_source_shm_dead_peer_2: dead_peer, 2, SHM, false;
    any_source_shm_dead_peer_3: dead_peer, 3, SHM, false;
    any_source_tcp_dead_peer_times_out_3: dead_peer, 3, TCP_DEAD, false;
    any_source_ucx_dead_peer_3: dead_peer, 3, ucx_common::LOOPBACK_ENV, true;
}
