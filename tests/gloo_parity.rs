//! TorchComm 0.3 parity on the gloo backend with real processes (2, 3 and 4
//! ranks, the shared-memory path and, with `TORCHCOMM_GLOO_SHM=0`, the Gloo
//! path): gather_single from every root, in place and out of place, counts
//! that do not divide evenly, outputs poisoned and every element checked;
//! tagged sends and receives matched by (peer, tag) in batches whose
//! entries come in different orders on the two sides, and a receive that
//! never takes a send of another tag; a persistent all-gather executed
//! repeatedly (in place too), and set up with counts that differ.

mod gloo_common;

use gloo_common::*;
use std::ffi::c_void;
use std::time::Duration;
use torchcomm::DType;
use torchcomm::ErrorKind;
use torchcomm::{Comm, Op, OpOptions, P2p, PersistentAllGather, Ptr};

const LIMIT: Duration = Duration::from_secs(240);
const POISON: i64 = -0x5a5a;

/// Element i of rank r's contribution.
fn datum(r: usize, i: usize) -> i64 {
    (r as i64 + 1) * 1_000_003 + i as i64 * 7
}

/// gather_single of `count` int64 from every rank to every root, out of
/// place and in place (the root's input is its own block of the output).
fn gather_single_every_root(comm: &Comm, count: usize) {
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    for root in 0..n {
        for in_place in [false, true] {
            let mut input: Vec<i64> = (0..count).map(|i| datum(me, i)).collect();
            let mut output = vec![POISON; count * n + 1];
            if in_place && me == root {
                output[me * count..(me + 1) * count].copy_from_slice(&input);
                input.clear();
            }
            let input_ptr = if input.is_empty() && count > 0 {
                Ptr(output[me * count..].as_mut_ptr() as *mut c_void)
            } else {
                ptr(&mut input)
            };
            let out_ptr = if me == root {
                ptr(&mut output)
            } else {
                Ptr(std::ptr::null_mut())
            };
            run(
                comm,
                Op::gather_single(out_ptr, input_ptr, count, DType::I64, root as i32),
            )
            .unwrap_or_else(|e| panic!("gather_single count {count} root {root}: {e}"));
            let expect = |k: usize| {
                if me == root && k < count * n {
                    datum(k / count.max(1), k % count.max(1))
                } else {
                    POISON
                }
            };
            for (k, v) in output.iter().enumerate() {
                assert_eq!(
                    *v,
                    expect(k),
                    "gather_single count {count} root {root} in_place {in_place}: element {k}"
                );
            }
        }
    }
}

fn gather_single_refusals(comm: &Comm) {
    let n = comm.size();
    let mut x = [0i64; 4];
    let bad_root = run(
        comm,
        Op::gather_single(ptr(&mut x), ptr(&mut x), 1, DType::I64, n),
    )
    .unwrap_err();
    assert_eq!(bad_root.kind, ErrorKind::InvalidArgument, "{bad_root}");
    assert!(bad_root.message.contains("root"), "{bad_root}");
    let null_output = run(
        comm,
        Op::gather_single(
            Ptr(std::ptr::null_mut()),
            ptr(&mut x),
            1,
            DType::I64,
            comm.rank(),
        ),
    )
    .unwrap_err();
    assert_eq!(null_output.kind, ErrorKind::NullArgument, "{null_output}");
    assert!(null_output.message.contains("output"), "{null_output}");
}

/// Message `tag` (and its `k`-th of that tag) from rank `src` to `dst`.
fn message(src: usize, dst: usize, tag: u32, k: usize) -> Vec<i64> {
    let len = 1 + (src + 2 * dst + tag as usize + k) % 5;
    (0..len)
        .map(|i| datum(src, i) * 100 + dst as i64 * 10_000 + tag as i64 * 1_000_000 + k as i64)
        .collect()
}

/// The (tag, k) of the messages each rank sends to each peer, in the order
/// its batch lists them; receives list them in another order.
const SENDS: [(u32, usize); 5] = [(3, 0), (7, 0), (1, 0), (7, 1), (0, 0)];
const RECVS: [(u32, usize); 5] = [(7, 0), (0, 0), (1, 0), (3, 0), (7, 1)];

/// One batch with every rank (self included): five messages each way,
/// tagged 3, 7, 1, 7 and 0, received in another order than sent; the two
/// of tag 7 pair up in order.
fn tagged_batch(comm: &Comm) {
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    let mut sends: Vec<Vec<i64>> = Vec::new();
    let mut recvs: Vec<Vec<i64>> = Vec::new();
    let mut ops = Vec::new();
    for peer in 0..n {
        for (tag, k) in SENDS {
            sends.push(message(me, peer, tag, k));
        }
        for (tag, k) in RECVS {
            recvs.push(vec![POISON; message(peer, me, tag, k).len()]);
        }
    }
    for peer in 0..n {
        for (j, (tag, _)) in SENDS.iter().enumerate() {
            let buf = &mut sends[peer * SENDS.len() + j];
            ops.push(P2p {
                is_send: true,
                buf: ptr(buf),
                count: buf.len(),
                dtype: DType::I64,
                peer: peer as i32,
                tag: *tag,
                source: None,
            });
        }
        for (j, (tag, _)) in RECVS.iter().enumerate() {
            let buf = &mut recvs[peer * RECVS.len() + j];
            ops.push(P2p {
                is_send: false,
                buf: ptr(buf),
                count: buf.len(),
                dtype: DType::I64,
                peer: peer as i32,
                tag: *tag,
                source: None,
            });
        }
    }
    run(comm, Op::batch(ops)).unwrap_or_else(|e| panic!("tagged batch: {e}"));
    for peer in 0..n {
        for (j, (tag, k)) in RECVS.iter().enumerate() {
            assert_eq!(
                recvs[peer * RECVS.len() + j],
                message(peer, me, *tag, *k),
                "message {k} of tag {tag} from rank {peer}"
            );
        }
    }
}

/// Separate tagged calls between ranks 0 and 1 (in the same order on both
/// sides), then, on a child comm of the two, a receive whose tag rank 0
/// never sends: it times out, naming the tag, and its buffer stays as it was.
fn tagged_calls(comm: &Comm) {
    let me = comm.rank() as usize;
    if me < 2 {
        let peer = 1 - me;
        for tag in [11u32, 12, 0] {
            let mut buf = if me == 0 {
                message(0, 1, tag, 0)
            } else {
                vec![POISON; message(0, 1, tag, 0).len()]
            };
            let (b, count) = (ptr(&mut buf), buf.len());
            let op = if me == 0 {
                Op::send(b, count, DType::I64, peer as i32, tag)
            } else {
                Op::recv(b, count, DType::I64, peer as i32, tag)
            };
            run(comm, op).unwrap_or_else(|e| panic!("tag {tag}: {e}"));
            assert_eq!(buf, message(0, 1, tag, 0), "tagged call, tag {tag}");
        }
    }
    let members: &[i32] = if me < 2 { &[0, 1] } else { &[] };
    let Some(pair) = comm
        .split(members, "tag-mismatch", Default::default())
        .unwrap()
    else {
        return;
    };
    let mut buf = vec![POISON; 3];
    let (b, count) = (ptr(&mut buf), buf.len());
    let quick = OpOptions {
        timeout: Some(Duration::from_millis(1500)),
        ..OpOptions::default()
    };
    let result = if me == 0 {
        let op = Op::send(b, count, DType::I64, 1, 5);
        pair.submit(op, &quick).and_then(|w| w.wait_blocking())
    } else {
        let op = Op::recv(b, count, DType::I64, 0, 6);
        let e = pair
            .submit(op, &quick)
            .and_then(|w| w.wait_blocking())
            .unwrap_err();
        assert!(
            matches!(e.kind, ErrorKind::Timeout | ErrorKind::Remote),
            "{e}"
        );
        // Gloo's text lists the tags in use; the shared-memory path names the
        // receive's tag.
        assert!(
            e.message.contains("tags 6") || e.message.contains("with tag 6"),
            "{e}"
        );
        assert_eq!(buf, vec![POISON; 3], "a receive took data of another tag");
        Ok(())
    };
    // A send is buffered on both paths: it completes without its receive
    // (through shared memory once its bytes are in the ring, through Gloo
    // once posted).
    if let Err(e) = result {
        panic!("a buffered send failed: {e}");
    }
    let _ = pair.finalize();
}

/// A persistent all-gather of 5 int64 per rank, executed three times with
/// new inputs and once in place; then a set-up where rank 1 passes another
/// count fails on every rank, naming a rank that differs.
fn persistent_all_gather(comm: &std::sync::Arc<Comm>) {
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    let count = 5;
    let mut output = vec![POISON; count * n];
    let p = PersistentAllGather::new(comm.clone(), ptr(&mut output), count, DType::I64).unwrap();
    for round in 0..3i64 {
        let input: Vec<i64> = (0..count).map(|i| datum(me, i) + round).collect();
        let input_ptr = Ptr(input.as_ptr() as *mut c_void);
        p.exec(input_ptr, &OpOptions::default()).unwrap();
        for (k, v) in output.iter().enumerate() {
            assert_eq!(
                *v,
                datum(k / count, k % count) + round,
                "round {round} element {k}"
            );
        }
    }
    for (i, v) in output[me * count..(me + 1) * count].iter_mut().enumerate() {
        *v = datum(me, i) * 2;
    }
    let own = Ptr(output[me * count..].as_mut_ptr() as *mut c_void);
    p.exec(own, &OpOptions::default()).unwrap();
    for (k, v) in output.iter().enumerate() {
        assert_eq!(*v, datum(k / count, k % count) * 2, "in place: element {k}");
    }
    let e = p
        .exec(Ptr(std::ptr::null_mut()), &OpOptions::default())
        .err()
        .expect("a null input was accepted");
    assert_eq!(e.kind, ErrorKind::NullArgument, "{e}");
    let mismatched = if me == 1 { 4 } else { 5 };
    let mut out2 = vec![0i64; 5 * n];
    let e = PersistentAllGather::new(comm.clone(), ptr(&mut out2), mismatched, DType::I64)
        .err()
        .expect("a set-up with counts that differ succeeded");
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
    assert!(e.message.contains("rank "), "{e}");
    // The comm stays usable after the refused set-up.
    p.exec(
        Ptr(output[me * count..].as_mut_ptr() as *mut c_void),
        &OpOptions::default(),
    )
    .unwrap();
}

#[test]
fn parity_child() {
    let Some(role) = role() else { return };
    let comm = child_comm(&format!("parity-{role}"), Duration::from_secs(60));
    match role.as_str() {
        "gather_single" => {
            for count in [0, 1, 7, 1001] {
                gather_single_every_root(&comm, count);
            }
            gather_single_refusals(&comm);
        }
        "persistent" => persistent_all_gather(&comm),
        "tags" => {
            tagged_batch(&comm);
            tagged_calls(&comm);
        }
        other => panic!("unknown role {other}"),
    }
    comm.finalize().unwrap();
    println!("RESULT ok");
}

/// Jobs of this file share one output folder (that of `parity_child`), which
/// each launch removes at its end: one job at a time.
static ONE_JOB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run_role(role: &str, size: usize, shm: bool) {
    let _one = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    let env: &[(&str, &str)] = if shm {
        &[]
    } else {
        &[("TORCHCOMM_GLOO_SHM", "0")]
    };
    let outcomes = launch("parity_child", role, size, env, LIMIT);
    assert_all_ok(&outcomes);
    for o in &outcomes {
        assert_eq!(o.results(), vec!["ok".to_string()], "{}", o.describe());
    }
}

#[test]
fn gather_single_2_3_4_ranks_both_paths() {
    for size in 2..=4 {
        for shm in [true, false] {
            run_role("gather_single", size, shm);
        }
    }
}

#[test]
fn tags_match_by_peer_and_tag_2_3_4_ranks_both_paths() {
    for size in 2..=4 {
        for shm in [true, false] {
            run_role("tags", size, shm);
        }
    }
}

#[test]
fn persistent_all_gather_2_3_4_ranks_both_paths() {
    for size in 2..=4 {
        for shm in [true, false] {
            run_role("persistent", size, shm);
        }
    }
}
