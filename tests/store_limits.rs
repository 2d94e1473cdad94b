//! The TCP store at and past its limits, with the server in its own process:
//! oversized keys and values refused before sending, refusals explained and
//! survived (the client connects again), no SET acknowledged unless stored,
//! `SIZE_MAX` lengths through the C API, long comm names, and a client that
//! never reads its replies.

mod store_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use store_common::*;
use torchcomm::store::ServerOptions;
use torchcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use torchcomm::ErrorKind;

const T: Duration = Duration::from_secs(30);

/// Child role "server": hosts a loopback store, prints its port, and lives
/// until the parent closes stdin.
fn serve_if_child() -> bool {
    if role().as_deref() != Some("server") {
        return false;
    }
    let server = TcpStoreServer::start_with(&ServerOptions {
        bind: Some("127.0.0.1".into()),
        ..ServerOptions::default()
    })
    .unwrap();
    println!("PORT {}", server.port());
    wait_for_parent();
    true
}

fn server_proc(test: &str, env: &[(&str, &str)]) -> (Proc, u16) {
    let mut p = spawn(test, "server", env);
    let port = p.port();
    (p, port)
}

fn client(port: u16, timeout: Duration) -> TcpStore {
    TcpStore::new(&TcpStoreOptions::client("127.0.0.1", port, timeout)).unwrap()
}

#[test]
fn oversized_keys_and_values_are_refused_before_sending() {
    if serve_if_child() {
        return;
    }
    let (server, port) = server_proc("oversized_keys_and_values_are_refused_before_sending", &[]);
    let s = client(port, T);
    let long_key = "k".repeat(9000);
    let err = s.set(&long_key, b"v").unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{}", err.message);
    assert!(err.message.contains("key limit of 8192"), "{}", err.message);
    let big = vec![7u8; 9 << 20];
    let err = s.set("big", &big).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{}", err.message);
    assert!(
        err.message.contains("value limit of 8388608"),
        "{}",
        err.message
    );
    for (what, res) in [
        ("compare_set", s.compare_set("big", b"", &big).map(|_| ())),
        ("append", s.append("big", &big)),
        ("get", s.get(&long_key).map(|_| ())),
        ("add", s.add(&long_key, 1).map(|_| ())),
        ("multi_set", s.multi_set(&[("a", b"1"), ("b", &big)])),
    ] {
        let err = res.unwrap_err();
        assert_eq!(
            err.kind,
            ErrorKind::InvalidArgument,
            "{what}: {}",
            err.message
        );
    }
    // Nothing was lost and the handle still works: the next SET is stored.
    s.set("after", b"stored").unwrap();
    assert_eq!(client(port, T).get("after").unwrap(), b"stored");
    assert!(!s.check(&["big"]).unwrap());
    let log = server.stop();
    assert!(
        !log.contains("closing connection"),
        "a refused request reached the server: {log}"
    );
}

#[test]
fn refused_add_is_explained_and_the_client_connects_again() {
    if serve_if_child() {
        return;
    }
    let (server, port) = server_proc(
        "refused_add_is_explained_and_the_client_connects_again",
        &[],
    );
    let s = client(port, T);
    s.set("word", b"abc").unwrap();
    let err = s.add("word", 1).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Remote, "{}", err.message);
    assert!(
        err.message.contains("ADD on key \"/word\"")
            && err.message.contains("not a decimal integer"),
        "{}",
        err.message
    );
    // The same handle keeps working (a new connection), nothing was lost.
    assert_eq!(s.get("word").unwrap(), b"abc");
    s.set("max", i64::MAX.to_string().as_bytes()).unwrap();
    let err = s.add("max", 1).unwrap_err();
    assert!(err.message.contains("past int64"), "{}", err.message);
    assert_eq!(s.add("counter", 5).unwrap(), 5);
    assert_eq!(s.get("max").unwrap(), i64::MAX.to_string().as_bytes());
    let log = server.stop();
    assert!(
        log.contains("not an integer") && log.contains("overflows"),
        "the server logs why it closed: {log}"
    );
}

/// Child role "refuser": a server that completes the handshake, then drops
/// each connection at its first request without storing it, as a server
/// with smaller limits (or one going away) would.
fn refuse_if_child() -> bool {
    if role().as_deref() != Some("refuser") {
        return false;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    println!("PORT {}", listener.local_addr().unwrap().port());
    for conn in listener.incoming() {
        let Ok(mut c) = conn else { continue };
        let mut hello = [0u8; 10];
        if c.read_exact(&mut hello).is_err() {
            continue;
        }
        let _ = c.write_all(&hello[6..10]);
        let mut first = [0u8; 1];
        let _ = c.read_exact(&mut first);
        eprintln!("refused a request with query code {}", first[0]);
    }
    true
}

#[test]
fn a_set_is_acknowledged_only_once_stored() {
    if serve_if_child() || refuse_if_child() {
        return;
    }
    let test = "a_set_is_acknowledged_only_once_stored";
    // A server that drops the SET: the SET fails, it does not report success.
    let mut refuser = spawn(test, "refuser", &[]);
    let s = client(refuser.port(), Duration::from_secs(5));
    for i in 0..3 {
        let err = s
            .set("k", b"v")
            .expect_err("a SET that was not stored succeeded");
        assert_eq!(err.kind, ErrorKind::Remote, "attempt {i}: {}", err.message);
        assert!(err.message.contains("SET on key \"/k\""), "{}", err.message);
    }
    drop(refuser);
    // A server process that died: likewise.
    let (mut server, port) = server_proc(test, &[]);
    let s = client(port, Duration::from_secs(3));
    s.set("before", b"1").unwrap();
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let err = s
        .set("lost", b"value")
        .expect_err("a SET to a dead server succeeded");
    assert!(
        matches!(err.kind, ErrorKind::Remote | ErrorKind::Timeout),
        "{err:?}"
    );
    assert!(!client_ok(port), "the server is gone");
}

fn client_ok(port: u16) -> bool {
    TcpStore::new(&TcpStoreOptions::client(
        "127.0.0.1",
        port,
        Duration::from_millis(300),
    ))
    .is_ok()
}

/// The C API with lengths near SIZE_MAX: refused, not an allocation abort.
#[test]
fn size_max_lengths_through_the_c_api_are_refused() {
    use torchcomm::capi::*;
    if role().as_deref() == Some("capi") {
        let mut st: *mut tc_store_t = std::ptr::null_mut();
        let host = c"127.0.0.1";
        let rc = tc_store_tcp_new(host.as_ptr(), 0, 1, -1, 10_000, &mut st);
        assert_eq!(rc as i32, 0);
        let byte = 0u8;
        let p = (&byte as *const u8).cast();
        for len in [usize::MAX, usize::MAX / 2, (9 << 20) as usize] {
            let rc = tc_store_set(st, c"k".as_ptr(), p, len);
            println!("RESULT set {len} rc={} {}", rc as i32, last_error());
            let mut cur = std::ptr::null_mut();
            let mut cur_len = 0usize;
            let rc = tc_store_compare_set(st, c"k".as_ptr(), p, 1, p, len, &mut cur, &mut cur_len);
            println!("RESULT compare_set {len} rc={} {}", rc as i32, last_error());
            let rc = tc_store_compare_set(st, c"k".as_ptr(), p, len, p, 1, &mut cur, &mut cur_len);
            println!(
                "RESULT compare_set_expected {len} rc={} {}",
                rc as i32,
                last_error()
            );
        }
        let rc = tc_store_set(st, c"k".as_ptr(), p, 1);
        println!("RESULT after rc={}", rc as i32);
        tc_store_free(st);
        return;
    }
    let child = spawn(
        "size_max_lengths_through_the_c_api_are_refused",
        "capi",
        &[],
    );
    let (ok, out, err) = child.finish(T);
    assert!(ok, "the process died:\n{out}\n{err}");
    let invalid = torchcomm::capi::TC_ERR_INVALID_ARGUMENT;
    let results: Vec<&str> = out
        .lines()
        .filter_map(|l| l.find("RESULT ").map(|p| &l[p..]))
        .collect();
    assert_eq!(results.len(), 10, "{out}");
    for l in &results[..9] {
        assert!(l.contains(&format!("rc={invalid} ")), "{l}");
        assert!(l.contains("value limit of 8388608"), "{l}");
    }
    assert_eq!(results[9], "RESULT after rc=0");
}

fn last_error() -> String {
    let p = torchcomm::capi::tc_last_error();
    if p.is_null() {
        return String::new();
    }
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// Comm and split names longer than the store accepts are refused up front;
/// the parent, its store and later comms keep working. Two ranks.
#[test]
fn long_comm_and_split_names_are_refused_and_nothing_breaks() {
    use torchcomm::Device;
    use torchcomm::{Comm, CommOptions};
    if serve_if_child() {
        return;
    }
    if role().as_deref() == Some("rank") {
        let rank: i32 = std::env::var("TC_STORE_RANK").unwrap().parse().unwrap();
        let port: u16 = std::env::var("TC_STORE_PORT").unwrap().parse().unwrap();
        let store: torchcomm::store::StoreRef = std::sync::Arc::new(client(port, T));
        let opts = |name: &str| CommOptions {
            name: Some(name.to_string()),
            rank: Some(rank),
            world_size: Some(2),
            store: Some(store.clone()),
            timeout: Some(T),
            abort_on_error: Some(false),
            ..CommOptions::default()
        };
        let parent = Comm::new("gloo", Device::Cpu, opts("parent")).unwrap();
        for len in [300, 9000] {
            let long = "n".repeat(len);
            let err = parent
                .split(&[0, 1], &long, CommOptions::default())
                .err()
                .unwrap();
            assert_eq!(err.kind, ErrorKind::InvalidArgument, "{}", err.message);
            assert!(err.message.contains("at most 256 bytes"), "{}", err.message);
            let err = Comm::new("gloo", Device::Cpu, opts(&long)).err().unwrap();
            assert_eq!(err.kind, ErrorKind::InvalidArgument, "{}", err.message);
        }
        let child = parent
            .split(&[0, 1], "child", CommOptions::default())
            .unwrap()
            .unwrap();
        let other = Comm::new("gloo", Device::Cpu, opts("other")).unwrap();
        for c in [&child, &other, &parent] {
            c.finalize().unwrap();
        }
        store.set(&format!("done{rank}"), b"1").unwrap();
        println!("RESULT ok");
        return;
    }
    let test = "long_comm_and_split_names_are_refused_and_nothing_breaks";
    let (server, port) = server_proc(test, &[]);
    let port_s = port.to_string();
    let ranks: Vec<Proc> = (0..2)
        .map(|r| {
            let r = r.to_string();
            spawn(
                test,
                "rank",
                &[("TC_STORE_RANK", &r), ("TC_STORE_PORT", &port_s)],
            )
        })
        .collect();
    for p in ranks {
        let (ok, out, err) = p.finish(Duration::from_secs(120));
        assert!(ok && out.contains("RESULT ok"), "{out}\n{err}");
    }
    drop(server);
}

/// A client that sends 60 GETs of an 8 MiB value and never reads: the
/// server stops reading it once its backlog is full, stays small, serves
/// the others, and drops it after the reply timeout.
#[test]
fn a_client_that_never_reads_is_bounded_and_dropped() {
    if serve_if_child() {
        return;
    }
    let (server, port) = server_proc(
        "a_client_that_never_reads_is_bounded_and_dropped",
        &[("TORCHCOMM_STORE_REPLY_TIMEOUT", "3")],
    );
    let s = client(port, T);
    let value = vec![b'x'; 8 << 20];
    s.set("big", &value).unwrap();
    let before = rss(server.pid());
    let mut raw = TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.write_all(&[0, 0xCE, 0xF7, 0x85, 0x3C]).unwrap();
    let mut get = vec![3u8];
    get.extend_from_slice(&4u64.to_le_bytes());
    get.extend_from_slice(b"/big");
    // Written from a thread: once the server stops reading, writes block.
    let sender = {
        let mut raw = raw.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..60 {
                if raw.write_all(&get).is_err() {
                    break;
                }
            }
        })
    };
    let mut peak = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        peak = peak.max(rss(server.pid()));
        // Other clients are served meanwhile.
        let c = client(port, T);
        c.set("other", b"1").unwrap();
        assert_eq!(c.get("other").unwrap(), b"1");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Past the reply timeout it is dropped: reading drains what the kernel
    // holds, then meets the end of the stream, or a reset when the server
    // closed with this client's unread requests still in its socket (the
    // kernel then sends RST instead of FIN; both mean the server let go).
    std::thread::sleep(Duration::from_secs(6));
    raw.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut sink = vec![0u8; 1 << 20];
    let mut total = 0usize;
    loop {
        match raw.read(&mut sink) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("no end of stream after {total} bytes: {e}"),
        }
    }
    let _ = sender.join();
    assert!(total < 60 * (8 << 20), "every reply arrived: {total} bytes");
    let grown = peak.saturating_sub(before);
    assert!(
        grown < 100 << 20,
        "server RSS grew by {} MiB (from {} MiB)",
        grown >> 20,
        before >> 20
    );
    assert_eq!(s.get("big").unwrap().len(), 8 << 20);
    let log = server.stop();
    assert!(log.contains("of replies unread"), "{log}");
}
