//! Reconfigurable comms (`tc_comm_reconfigure`, `Reconfigurable`) on the
//! gloo backend with real processes: three processes form a comm from
//! their init handles, shrink to two (one leaves), grow to three (a
//! process that was never in the comm joins), reorder by list order and
//! re-form from a set; all_reduce, all_gather and broadcast are checked
//! after each, on the shared-memory path and on Gloo's TCP path. Members
//! passing different lists fail naming the member that differs; a member
//! that never calls makes the others fail by the timeout naming it; bad
//! arguments are refused naming the argument.

mod gloo_common;

use gloo_common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchcomm::store::{StoreRef, TcpStore, TcpStoreOptions, TcpStoreServer};
use torchcomm::ErrorKind;
use torchcomm::{Comm, CommOptions, CommSlot, Op, Reconfigurable};
use torchcomm::{DType, Device, ReduceOp};

const TIMEOUT: Duration = Duration::from_secs(40);
const LIMIT: Duration = Duration::from_secs(200);

fn reconfigurable(store: StoreRef, name: &str) -> Reconfigurable {
    Reconfigurable::new(
        "gloo",
        Device::Cpu,
        CommOptions {
            name: Some(name.to_string()),
            timeout: Some(TIMEOUT),
            abort_on_error: Some(false),
            store: Some(store),
            ..Default::default()
        },
    )
    .unwrap()
}

fn own_handle(r: &Reconfigurable) -> String {
    r.init_handle().to_str().unwrap().to_string()
}

/// Publishes this process's handle as `key` and returns it.
fn publish(store: &StoreRef, r: &Reconfigurable, key: &str) -> String {
    let h = own_handle(r);
    store.set(key, h.as_bytes()).unwrap();
    h
}

/// The handle published as `key`, waiting for it.
fn fetch(store: &StoreRef, key: &str) -> String {
    store.wait(&[key], Some(TIMEOUT)).unwrap();
    String::from_utf8(store.get(key).unwrap()).unwrap()
}

fn reconfigure(r: &Reconfigurable, uuid: i64, handles: &[String], as_set: bool) {
    let list: Vec<&str> = handles.iter().map(String::as_str).collect();
    r.reconfigure(uuid, &list, as_set, None, Vec::new())
        .unwrap_or_else(|e| panic!("reconfigure uuid {uuid}: {e}"));
}

/// Checks the formed comm of `members` (process ids, in rank order) from
/// process `id`: rank and size, an all_reduce of (id + 1), an all_gather
/// of the ids in rank order and a broadcast of rank 0's id.
fn check_formed(r: &Reconfigurable, id: i32, members: &[i32]) {
    let comm: &Arc<Comm> = r.current().expect("formed");
    let me = members.iter().position(|m| *m == id).unwrap() as i32;
    assert_eq!((comm.rank(), comm.size()), (me, members.len() as i32));
    let mut x = vec![id as f32 + 1.0; 1000];
    run(
        comm,
        Op::all_reduce(ptr(&mut x), x.len(), DType::F32, ReduceOp::SUM),
    )
    .unwrap();
    let want: f32 = members.iter().map(|m| *m as f32 + 1.0).sum();
    assert!(
        x.iter().all(|v| *v == want),
        "all_reduce {} != {want}",
        x[0]
    );
    let mut mine = [id];
    let mut all = vec![-1i32; members.len()];
    run(
        comm,
        Op::all_gather_single(ptr(&mut all), ptr(&mut mine), 1, DType::I32),
    )
    .unwrap();
    assert_eq!(all, members, "all_gather: the ids in rank order");
    let mut b = vec![if me == 0 { id * 10 + 7 } else { -1 }; 333];
    run(comm, Op::broadcast(ptr(&mut b), b.len(), DType::I32, 0)).unwrap();
    assert!(
        b.iter().all(|v| *v == members[0] * 10 + 7),
        "broadcast {}",
        b[0]
    );
    println!("RESULT formed {members:?}");
}

/// Processes 0, 1, 2 form a comm; 2 leaves (3 -> 2); process 3, never in
/// the comm, joins (2 -> 3); the members reorder by list; then re-form from
/// a set. Process 3 waits for its turn.
fn shrink_grow_reorder() {
    let id = rank();
    let store = child_store();
    let r = reconfigurable(store.clone(), "elastic");
    let h = |i: i32| fetch(&store, &format!("handle/{i}"));
    if id == 3 {
        // A newcomer: publishes its handle once the others shrank.
        fetch(&store, "shrunk/0");
        fetch(&store, "shrunk/1");
        publish(&store, &r, "handle/3");
        reconfigure(&r, 2, &[h(0), h(1), h(3)], false);
        check_formed(&r, 3, &[0, 1, 3]);
    } else {
        publish(&store, &r, &format!("handle/{id}"));
        let first = [h(0), h(1), h(2)];
        assert!(r.current().is_none());
        reconfigure(&r, 0, &first, false);
        check_formed(&r, id, &[0, 1, 2]);
        if id == 2 {
            // Leaves: the others shrink without it.
            r.finalize().unwrap();
            println!("RESULT left");
            return;
        }
        let before = r.current().unwrap().clone();
        reconfigure(&r, 1, &[h(0), h(1)], false);
        check_formed(&r, id, &[0, 1]);
        let e = before.check_active().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
        assert!(e.message.contains("reconfigured (uuid 1)"), "{e}");
        store.set(&format!("shrunk/{id}"), b"1").unwrap();
        reconfigure(&r, 2, &[h(0), h(1), h(3)], false);
        check_formed(&r, id, &[0, 1, 3]);
    }
    // Reorder: the list's order is the rank order.
    reconfigure(&r, 3, &[h(3), h(0), h(1)], false);
    check_formed(&r, id, &[3, 0, 1]);
    // A set: each passes its own order; ranks follow the handles' text.
    let mut set = vec![h(0), h(1), h(3)];
    set.rotate_left(id as usize % 3);
    reconfigure(&r, 4, &set, true);
    let mut by_text: Vec<(String, i32)> = vec![(h(0), 0), (h(1), 1), (h(3), 3)];
    by_text.sort();
    let order: Vec<i32> = by_text.iter().map(|(_, i)| *i).collect();
    check_formed(&r, id, &order);
    r.finalize().unwrap();
}

fn launch_elastic(test: &str, env: &[(&str, &str)]) {
    let out = launch(test, "elastic", 4, env, LIMIT);
    let all: String = out
        .iter()
        .map(|o| o.describe())
        .collect::<Vec<_>>()
        .join("\n");
    assert_all_ok(&out);
    // Formed: 4 times by 0 and 1 after the first, 3 by the newcomer; 2
    // leaves after the first.
    let counts: Vec<usize> = out.iter().map(|o| o.results().len()).collect();
    assert_eq!(counts, vec![5, 5, 2, 3], "{all}");
}

#[test]
fn gloo_reconfigure_shrink_grow_reorder() {
    if role().is_some() {
        return shrink_grow_reorder();
    }
    launch_elastic("gloo_reconfigure_shrink_grow_reorder", &[]);
}

/// The same over Gloo's TCP transport (no shared-memory collectives).
#[test]
fn gloo_reconfigure_shrink_grow_reorder_tcp() {
    if role().is_some() {
        return shrink_grow_reorder();
    }
    launch_elastic(
        "gloo_reconfigure_shrink_grow_reorder_tcp",
        &[("TORCHCOMM_GLOO_SHM", "0")],
    );
}

/// Two members passing the same handles in different orders both fail
/// naming the other; with a new uuid and one order they form the comm. A
/// third process whose handle is listed never calls: the others fail by
/// the timeout naming it, well before the limit, and the comm is left as
/// it was (re-formed without it afterwards).
#[test]
fn gloo_reconfigure_mismatch_and_missing_member() {
    if role().is_some() {
        let id = rank();
        let store = child_store();
        let r = reconfigurable(store.clone(), "picky");
        publish(&store, &r, &format!("handle/{id}"));
        let h = |i: i32| fetch(&store, &format!("handle/{i}"));
        if id == 2 {
            // Publishes its handle, then never reconfigures.
            fetch(&store, "done/0");
            fetch(&store, "done/1");
            return;
        }
        let mut pair = [h(0), h(1)];
        if id == 1 {
            pair.reverse();
        }
        let list: Vec<&str> = pair.iter().map(String::as_str).collect();
        let e = r
            .reconfigure(0, &list, false, None, Vec::new())
            .unwrap_err();
        println!("RESULT mismatch {e}");
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        let other = if id == 0 { 1 } else { 0 };
        assert!(
            e.message.contains("another order") && e.message.contains(&h(other)),
            "{e}"
        );
        assert!(r.current().is_none(), "a failed reconfigure forms nothing");
        reconfigure(&r, 1, &[h(0), h(1)], false);
        check_formed(&r, id, &[0, 1]);
        // Process 2 never comes.
        let three = [h(0), h(1), h(2)];
        let list: Vec<&str> = three.iter().map(String::as_str).collect();
        let start = Instant::now();
        let e = r
            .reconfigure(2, &list, false, Some(Duration::from_secs(3)), Vec::new())
            .unwrap_err();
        println!("RESULT missing {e} after {:?}", start.elapsed());
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(
            e.message.contains("rank 2") && e.message.contains(&h(2)),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(30));
        // Left as it was: still the comm of 0 and 1.
        check_formed(&r, id, &[0, 1]);
        store.set(&format!("done/{id}"), b"1").unwrap();
        r.finalize().unwrap();
        return;
    }
    let out = launch(
        "gloo_reconfigure_mismatch_and_missing_member",
        "picky",
        3,
        &[],
        LIMIT,
    );
    let all: String = out
        .iter()
        .map(|o| o.describe())
        .collect::<Vec<_>>()
        .join("\n");
    assert_all_ok(&out);
    let counts: Vec<usize> = out.iter().map(|o| o.results().len()).collect();
    assert_eq!(counts, vec![4, 4, 0], "{all}");
}

/// Bad arguments, in one process: each refused naming the argument, before
/// any communication.
#[test]
fn gloo_reconfigure_refuses_bad_arguments() {
    let server = TcpStoreServer::start(0).unwrap();
    let other_job = TcpStoreServer::start(0).unwrap();
    let store_of = |s: &TcpStoreServer| -> StoreRef {
        Arc::new(TcpStore::new(&TcpStoreOptions::client("127.0.0.1", s.port(), TIMEOUT)).unwrap())
    };
    let store = store_of(&server);
    let r = reconfigurable(store.clone(), "solo");
    let mine = own_handle(&r);
    let other_name = own_handle(&reconfigurable(store.clone(), "other"));
    let foreign = own_handle(&reconfigurable(store_of(&other_job), "solo"));
    assert_ne!(mine, foreign);
    // A second comm of the same name and store: another member to be.
    let peer = own_handle(&reconfigurable(store.clone(), "solo"));
    let refused = |uuid: i64, list: &[&str], what: &str| {
        let e = r
            .reconfigure(uuid, list, false, Some(Duration::from_secs(2)), Vec::new())
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what}: {e}");
        assert!(e.message.contains(what), "{what}: {e}");
    };
    refused(0, &[], "'init_handles': empty");
    refused(0, &[&mine, "gloo:0:0:127.0.0.1:29500"], "'init_handles[1]'");
    refused(0, &[&mine, &foreign], "another job");
    refused(0, &[&other_name, &mine], "'init_handles[0]'");
    refused(0, &[&mine, &peer, &mine], "'init_handles[2]': handle");
    refused(0, &[&peer], "own handle");
    refused(-1, &[&mine], "'uuid'");
    // The pending comm refuses operations, naming reconfigure.
    let slot = CommSlot::Reconfigurable(Box::new(r));
    let e = slot.get().map(|_| ()).unwrap_err();
    assert!(e.message.contains("tc_comm_reconfigure"), "{e}");
    let CommSlot::Reconfigurable(r) = slot else {
        unreachable!()
    };
    // A comm of one member forms; a uuid serves once.
    reconfigure(&r, 7, std::slice::from_ref(&mine), false);
    assert_eq!(r.current().unwrap().size(), 1);
    let e = r
        .reconfigure(7, &[&mine], false, None, Vec::new())
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
    assert!(e.message.contains("uuid 7"), "{e}");
    // A comm formed at creation is not reconfigurable.
    let fixed = child_comm_on(store.clone(), "fixed", 0, 1, TIMEOUT).unwrap();
    let e = CommSlot::Fixed(fixed.clone())
        .reconfigurable("tc_comm_reconfigure")
        .map(|_| ())
        .unwrap_err();
    assert!(e.message.contains("enable_reconfigure"), "{e}");
    fixed.finalize().unwrap();
    r.finalize().unwrap();
}
