//! The TCP store, client and server together: the behaviours torch's own
//! store tests check, plus concurrency and rendezvous at scale.

use std::sync::Arc;
use std::time::{Duration, Instant};
use torchcomm::store::{PrefixStore, Store, StoreRef, TcpStore, TcpStoreOptions, TcpStoreServer};
use torchcomm::ErrorKind;

const T: Duration = Duration::from_secs(20);

fn server_store(world_size: Option<u32>) -> TcpStore {
    let mut o = TcpStoreOptions::server(0, T);
    o.world_size = world_size;
    TcpStore::new(&o).unwrap()
}

fn client(port: u16) -> TcpStore {
    TcpStore::new(&TcpStoreOptions::client("127.0.0.1", port, T)).unwrap()
}

#[test]
fn set_add_get_as_torch() {
    let s = server_store(Some(1));
    s.set("key0", b"value0").unwrap();
    s.add("key1", 6).unwrap();
    assert_eq!(s.get("key1").unwrap(), b"6");
    s.add("key2", 6).unwrap();
    assert_eq!(s.add("key2", 15).unwrap(), 21);
    assert_eq!(s.get("key0").unwrap(), b"value0");
    assert_eq!(s.get("key2").unwrap(), b"21");
    // init/ (from the world_size wait) counts too.
    assert_eq!(s.num_keys().unwrap(), 4);
    assert!(s.check(&["key0", "key1"]).unwrap());
    assert!(!s.check(&["key0", "nope"]).unwrap());
    assert!(s.delete("key0").unwrap());
    assert!(!s.delete("key0").unwrap());
    assert_eq!(s.num_keys().unwrap(), 3);
    let keys = s.list_keys().unwrap();
    assert!(
        keys.contains(&b"init/".to_vec()) && keys.contains(&b"/key1".to_vec()),
        "{keys:?}"
    );
}

#[test]
fn compare_set_including_missing_key_quirk() {
    let s = server_store(None);
    // Missing key, non-empty expected: nothing stored, expected returned.
    assert_eq!(s.compare_set("cs", b"x", b"y").unwrap(), b"x");
    assert!(!s.check(&["cs"]).unwrap());
    // Missing key, empty expected: desired stored.
    assert_eq!(s.compare_set("cs", b"", b"first").unwrap(), b"first");
    assert_eq!(s.compare_set("cs", b"wrong", b"second").unwrap(), b"first");
    assert_eq!(s.compare_set("cs", b"first", b"second").unwrap(), b"second");
    assert_eq!(s.get("cs").unwrap(), b"second");
}

#[test]
fn wait_times_out_within_bound_and_client_stays_usable() {
    let s = server_store(None);
    let start = Instant::now();
    let err = s
        .wait(&["missing"], Some(Duration::from_millis(250)))
        .unwrap_err();
    let el = start.elapsed();
    assert_eq!(err.kind, ErrorKind::Timeout);
    assert_eq!(err.message, "wait timeout after 250ms, keys: /missing");
    assert!(
        el >= Duration::from_millis(240) && el < Duration::from_secs(2),
        "{el:?}"
    );
    s.set("after", b"1").unwrap();
    assert_eq!(s.get("after").unwrap(), b"1");
    // The cancelled wait must not fire later on this connection.
    s.set("missing", b"now").unwrap();
    assert_eq!(s.add("n", 1).unwrap(), 1);
    assert_eq!(s.get("missing").unwrap(), b"now");
}

#[test]
fn wait_is_woken_by_every_kind_of_write() {
    let s = Arc::new(server_store(None));
    type Write = Box<dyn Fn(&TcpStore) + Send>;
    let writes: Vec<Write> = vec![
        Box::new(|c| c.set("w", b"1").unwrap()),
        Box::new(|c| {
            c.add("w", 1).unwrap();
        }),
        Box::new(|c| c.append_bytes("w", b"x").unwrap()),
        Box::new(|c| c.multi_set(&[("w", b"1")]).unwrap()),
        Box::new(|c| {
            c.compare_set("w", b"", b"1").unwrap();
        }),
    ];
    for (i, w) in writes.into_iter().enumerate() {
        s.delete("w").unwrap();
        let waiter = s.clone_store().unwrap();
        let t = std::thread::spawn(move || waiter.wait(&["w"], Some(Duration::from_secs(10))));
        std::thread::sleep(Duration::from_millis(50));
        w(&s);
        t.join()
            .unwrap()
            .unwrap_or_else(|e| panic!("write kind {i}: {e}"));
    }
}

#[test]
fn append_multi_and_queues() {
    let s = server_store(None);
    s.append_bytes("a", b"po").unwrap();
    s.append_bytes("a", b"tato").unwrap();
    assert_eq!(s.get("a").unwrap(), b"potato");
    s.multi_set(&[("m1", b"one"), ("m2", b"two")]).unwrap();
    assert_eq!(
        s.multi_get(&["m2", "m1", "a"]).unwrap(),
        vec![b"two".to_vec(), b"one".to_vec(), b"potato".to_vec()]
    );
    for v in [b"q1", b"q2", b"q3"] {
        s.queue_push("q", v).unwrap();
    }
    assert_eq!(s.queue_len("q").unwrap(), 3);
    assert_eq!(s.queue_pop("q", false).unwrap().unwrap(), b"q1");
    assert_eq!(s.queue_pop("q", true).unwrap().unwrap(), b"q2");
    assert_eq!(s.queue_pop("q", false).unwrap().unwrap(), b"q3");
    assert_eq!(s.queue_pop("q", false).unwrap(), None);
    // A blocking pop is woken by a push from another connection.
    let other = s.clone_store().unwrap();
    let t = std::thread::spawn(move || other.queue_pop("q", true).unwrap());
    std::thread::sleep(Duration::from_millis(50));
    s.queue_push("q", b"late").unwrap();
    assert_eq!(t.join().unwrap().unwrap(), b"late");
}

#[test]
fn clone_and_prefix_share_one_namespace() {
    let s = server_store(None);
    let c = s.clone_store().unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(s.get("k").unwrap(), b"v");
    let base: StoreRef = Arc::new(s.clone_store().unwrap());
    let p = PrefixStore::new("default_pg", Arc::new(PrefixStore::new("x", base)));
    p.set("key", b"1").unwrap();
    // SET has no reply: a round trip on the same connection orders it before
    // the listing made on another connection.
    assert_eq!(p.get("key").unwrap(), b"1");
    // On the wire: "/x/default_pg/key"
    assert!(s
        .list_keys()
        .unwrap()
        .contains(&b"/x/default_pg/key".to_vec()));
    assert_eq!(s.get("x/default_pg/key").unwrap(), b"1");
    let pc = p.clone_store().unwrap();
    assert_eq!(pc.get("key").unwrap(), b"1");
}

#[test]
fn address_already_in_use_and_bad_world_size() {
    let a = TcpStoreServer::start(0).unwrap();
    let err = TcpStoreServer::start(a.port()).err().unwrap();
    assert!(
        err.message.contains("address already in use"),
        "{}",
        err.message
    );
    let mut o = TcpStoreOptions::server(0, T);
    o.world_size = Some(0);
    assert_eq!(
        TcpStore::new(&o).err().unwrap().kind,
        ErrorKind::InvalidArgument
    );
}

#[test]
fn clients_joined_timeout_and_connect_failure_messages() {
    let mut o = TcpStoreOptions::server(0, Duration::from_millis(300));
    o.world_size = Some(3);
    let err = TcpStore::new(&o).err().unwrap();
    assert_eq!(err.kind, ErrorKind::Timeout);
    assert!(
        err.message
            .contains("waiting for clients. 1/3 clients joined."),
        "{}",
        err.message
    );

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let start = Instant::now();
    let err = TcpStore::new(&TcpStoreOptions::client(
        "127.0.0.1",
        port,
        Duration::from_millis(300),
    ))
    .err()
    .unwrap();
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(
        err.message.contains(&format!("127.0.0.1:{port}")),
        "{}",
        err.message
    );
}

#[test]
fn many_workers_fixed_and_unset_world_size() {
    for ws in [Some(8u32), None] {
        let mut o = TcpStoreOptions::server(0, T);
        o.world_size = ws;
        // The host waits for workers: create it on a thread.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        o.port = port;
        let host = std::thread::spawn(move || TcpStore::new(&o).unwrap());
        let workers: Vec<_> = (1..8)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut c = TcpStoreOptions::client("127.0.0.1", port, T);
                    c.world_size = ws;
                    let s = TcpStore::new(&c).unwrap();
                    s.set(&format!("w{i}"), b"x").unwrap();
                    s
                })
            })
            .collect();
        let host = host.join().unwrap();
        let _ws: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        let keys: Vec<String> = (1..8).map(|i| format!("w{i}")).collect();
        host.wait(&keys.iter().map(|s| s.as_str()).collect::<Vec<_>>(), None)
            .unwrap();
        if ws.is_some() {
            assert_eq!(host.get_raw(b"init/").unwrap(), b"8");
        }
    }
}

#[test]
fn sixteen_threads_times_1000_adds() {
    let s = Arc::new(server_store(None));
    let threads: Vec<_> = (0..16)
        .map(|i| {
            // Half share one connection, half have their own.
            let c: Arc<dyn Store> = if i % 2 == 0 {
                s.clone()
            } else {
                Arc::new(s.clone_store().unwrap())
            };
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    c.add("counter", 1).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.get("counter").unwrap(), b"16000");
}

#[test]
fn clean_shutdown_while_client_parked_in_wait() {
    let mut server = TcpStoreServer::start(0).unwrap();
    let c = client(server.port());
    let t = std::thread::spawn(move || {
        let start = Instant::now();
        (
            c.wait(&["never"], Some(Duration::from_secs(30))),
            start.elapsed(),
        )
    });
    std::thread::sleep(Duration::from_millis(100));
    server.shutdown();
    let (res, el) = t.join().unwrap();
    let err = res.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Remote, "{}", err.message);
    assert!(el < Duration::from_secs(5), "{el:?}");
}

#[test]
fn rendezvous_256_clients() {
    let server = TcpStoreServer::start(0).unwrap();
    let port = server.port();
    let n = 256;
    let start = Instant::now();
    let threads: Vec<_> = (0..n)
        .map(|_| {
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || {
                    let c = client(port);
                    let me = c.add("arrived", 1).unwrap();
                    if me == n as i64 {
                        c.set("go", b"1").unwrap();
                    }
                    c.wait(&["go"], None).unwrap();
                    me
                })
                .unwrap()
        })
        .collect();
    let mut ranks: Vec<i64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    ranks.sort();
    assert_eq!(ranks, (1..=n as i64).collect::<Vec<_>>());
    assert!(start.elapsed() < Duration::from_secs(30));
}
