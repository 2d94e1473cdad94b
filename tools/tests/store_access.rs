//! Who may connect to a store: tc-run's store and a `MASTER_ADDR` store
//! listen on one address only (checked in /proc/net/tcp* and by connecting
//! through another address of this machine), and a store token keeps out
//! clients without it or with a wrong one.

#[path = "../../tests/store_common/mod.rs"]
mod store_common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;
use store_common::*;
use torchcomm::store::{Store, TcpStore, TcpStoreOptions};
use torchcomm::ErrorKind;

const T: Duration = Duration::from_secs(30);
const TC_RUN: &str = env!("CARGO_BIN_EXE_tc-run");

/// /proc/net/tcp's spelling of an IPv4 address (little-endian hex).
fn proc_hex(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("{:02X}{:02X}{:02X}{:02X}", o[3], o[2], o[1], o[0])
}

fn connects(ip: IpAddr, port: u16) -> bool {
    TcpStream::connect_timeout(&SocketAddr::new(ip, port), Duration::from_secs(5)).is_ok()
}

/// The listening sockets of `port` are exactly `ip`, and a connection to
/// `other` (another address of this machine) is refused.
fn assert_only(port: u16, ip: Ipv4Addr, other: Option<Ipv4Addr>) {
    assert!(
        connects(IpAddr::V4(ip), port),
        "{ip}:{port} does not answer"
    );
    match other {
        Some(o) => assert!(
            !connects(IpAddr::V4(o), port),
            "{o}:{port} accepted a client"
        ),
        None => eprintln!("SKIPPED the connect check: no second IPv4 address on this machine"),
    }
    let listening = listening_addresses(port);
    assert_eq!(
        listening,
        vec![proc_hex(ip)],
        "sockets listening on port {port}"
    );
}

#[test]
fn tc_run_store_listens_on_loopback_only() {
    // The rank prints the port, then waits for us to check it.
    let mut child = Command::new(TC_RUN)
        .args([
            "-n",
            "1",
            "--",
            "sh",
            "-c",
            "echo PORT $MASTER_PORT; sleep 60",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    out.read_line(&mut line).unwrap();
    let port: u16 = line[line.find("PORT ").expect(&line) + 5..]
        .trim()
        .parse()
        .unwrap();
    // A client coming from this host's own non-loopback address is what a
    // remote host would look like; 127.0.0.2 would still be loopback.
    assert_only(port, Ipv4Addr::LOCALHOST, non_loopback_ipv4());
    // tc-run forwards SIGTERM to its ranks.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let _ = child.wait();
}

/// Child role "host": rank 0 of a one-rank job bootstrapped from the
/// environment (so it hosts the store at MASTER_ADDR:MASTER_PORT).
fn host_if_child() -> bool {
    if role().as_deref() != Some("host") {
        return false;
    }
    let comm = torchcomm::Comm::new(
        "gloo",
        torchcomm::Device::Cpu,
        torchcomm::CommOptions {
            name: Some("solo".into()),
            timeout: Some(T),
            ..Default::default()
        },
    )
    .unwrap();
    println!("PORT {}", std::env::var("MASTER_PORT").unwrap());
    wait_for_parent();
    comm.finalize().unwrap();
    true
}

fn host_on(test: &str, addr: Ipv4Addr) -> (Proc, u16) {
    let port = free_port();
    let env = [
        ("RANK", "0".to_string()),
        ("WORLD_SIZE", "1".into()),
        ("MASTER_ADDR", addr.to_string()),
        ("MASTER_PORT", port.to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut p = spawn(test, "host", &env);
    assert_eq!(p.port(), port);
    (p, port)
}

#[test]
fn master_addr_store_listens_on_that_address_only() {
    if host_if_child() {
        return;
    }
    let test = "master_addr_store_listens_on_that_address_only";
    let (host, port) = host_on(test, Ipv4Addr::LOCALHOST);
    assert_only(port, Ipv4Addr::LOCALHOST, non_loopback_ipv4());
    drop(host);
    let Some(ip) = non_loopback_ipv4() else {
        eprintln!("SKIPPED the non-loopback case: no second IPv4 address on this machine");
        return;
    };
    let (host, port) = host_on(test, ip);
    assert_only(port, ip, Some(Ipv4Addr::LOCALHOST));
    drop(host);
}

/// Child role "server": a loopback store requiring TORCHCOMM_STORE_TOKEN.
/// Child role "client": sets a key with the token from its environment.
fn token_child() -> bool {
    match role().as_deref() {
        Some("server") => {
            let s = TcpStore::new(&TcpStoreOptions::server(0, T)).unwrap();
            println!("PORT {}", s.port());
            wait_for_parent();
            true
        }
        Some("client") => {
            let port: u16 = std::env::var("TC_STORE_PORT").unwrap().parse().unwrap();
            let s = TcpStore::new(&TcpStoreOptions::client("127.0.0.1", port, T)).unwrap();
            s.set("from_child", b"hello").unwrap();
            println!("RESULT ok");
            true
        }
        _ => false,
    }
}

fn with_token(port: u16, token: Option<&str>) -> torchcomm::Result<TcpStore> {
    let mut o = TcpStoreOptions::client("127.0.0.1", port, Duration::from_secs(3));
    o.token = token.map(|t| t.as_bytes().to_vec());
    TcpStore::new(&o)
}

/// Sends raw bytes after VALIDATE and returns everything the server sends
/// back before closing.
fn raw_exchange(port: u16, after_validate: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut msg = vec![0, 0xCE, 0xF7, 0x85, 0x3C];
    msg.extend_from_slice(after_validate);
    s.write_all(&msg).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .expect("the server did not close the connection");
    got
}

fn lp(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

#[test]
fn a_token_store_refuses_clients_without_the_token() {
    if token_child() {
        return;
    }
    let test = "a_token_store_refuses_clients_without_the_token";
    let mut server = spawn(test, "server", &[("TORCHCOMM_STORE_TOKEN", "s3cret")]);
    let port = server.port();
    let good = with_token(port, Some("s3cret")).unwrap();
    good.set("secret", b"rendezvous").unwrap();

    // Our client without a token, or with a wrong one: refused, told why.
    for token in [None, Some("wrong"), Some("s3cre"), Some("s3cret0")] {
        let err = with_token(port, token)
            .err()
            .expect("admitted without the token");
        assert_eq!(err.kind, ErrorKind::Remote, "{token:?}: {}", err.message);
        assert!(err.message.contains("store token"), "{}", err.message);
    }
    // A raw client (as torch's would be) gets nothing, and its SET and GET
    // are not served.
    let mut set_get = vec![1u8];
    set_get.extend(lp(b"/stolen"));
    set_get.extend(lp(b"x"));
    set_get.push(3);
    set_get.extend(lp(b"/secret"));
    set_get.extend([13, 1, 2, 3, 4]);
    assert_eq!(raw_exchange(port, &set_get), b"");
    let mut wrong = vec![200u8];
    wrong.extend(0x4B54_4354u32.to_le_bytes());
    wrong.extend(lp(b"guess"));
    wrong.extend(&set_get);
    assert_eq!(raw_exchange(port, &wrong), b"");
    assert!(!good.check(&["stolen"]).unwrap());

    // A client process with the token in its environment is admitted.
    let port_s = port.to_string();
    let c = spawn(
        test,
        "client",
        &[
            ("TORCHCOMM_STORE_TOKEN", "s3cret"),
            ("TC_STORE_PORT", &port_s),
        ],
    );
    let (ok, out, err) = c.finish(Duration::from_secs(60));
    assert!(ok && out.contains("RESULT ok"), "{out}\n{err}");
    assert_eq!(good.get("from_child").unwrap(), b"hello");

    let log = server.stop();
    assert!(log.contains("without presenting the store token"), "{log}");
    assert!(log.contains("wrong store token"), "{log}");
}
