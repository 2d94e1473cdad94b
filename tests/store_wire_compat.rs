//! Byte compatibility, written from tcpstore-protocol.md alone: a raw-socket
//! client (no crate encoding) against our server, our client against an
//! independent fake server, and the server's robustness against malformed,
//! truncated, oversized and slow requests.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;
use torchcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};

fn lp(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(b);
    v
}
fn n64(n: u64) -> Vec<u8> {
    n.to_le_bytes().to_vec()
}

struct Raw(TcpStream);

impl Raw {
    fn open(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw(s)
    }
    fn validated(port: u16) -> Raw {
        let mut r = Raw::open(port);
        r.send(&[&[0x00, 0xCE, 0xF7, 0x85, 0x3C]]);
        r
    }
    fn send(&mut self, parts: &[&[u8]]) {
        self.0.write_all(&parts.concat()).unwrap();
    }
    fn read(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.0.read_exact(&mut v).unwrap();
        v
    }
    fn read_u64(&mut self) -> u64 {
        u64::from_le_bytes(self.read(8).try_into().unwrap())
    }
    fn read_value(&mut self) -> Vec<u8> {
        let n = self.read_u64() as usize;
        self.read(n)
    }
    /// True when the server closed this connection (EOF or reset).
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.0.read(&mut b), Ok(0) | Err(_))
    }
}

fn healthy(port: u16) {
    let c = TcpStore::new(&TcpStoreOptions::client(
        "127.0.0.1",
        port,
        Duration::from_secs(10),
    ))
    .unwrap();
    c.set("health", b"ok").unwrap();
    assert_eq!(c.get("health").unwrap(), b"ok");
}

#[test]
fn raw_client_does_every_operation() {
    let server = TcpStoreServer::start(0).unwrap();
    let mut r = Raw::validated(server.port());
    // PING echoes the nonce.
    r.send(&[&[13], &0xA1B2C3D4u32.to_le_bytes()]);
    assert_eq!(r.read(4), 0xA1B2C3D4u32.to_le_bytes());
    // SET, GET
    r.send(&[&[1], &lp(b"/a"), &lp(b"hello")]);
    r.send(&[&[3], &lp(b"/a")]);
    assert_eq!(r.read_value(), b"hello");
    // GET of a missing key: empty value (libuv server).
    r.send(&[&[3], &lp(b"/missing")]);
    assert_eq!(r.read_value(), b"");
    // ADD twice; the stored value is ASCII.
    r.send(&[&[4], &lp(b"/n"), &6i64.to_le_bytes()]);
    assert_eq!(r.read(8), 6i64.to_le_bytes());
    r.send(&[&[4], &lp(b"/n"), &15i64.to_le_bytes()]);
    assert_eq!(r.read(8), 21i64.to_le_bytes());
    r.send(&[&[3], &lp(b"/n")]);
    assert_eq!(r.read_value(), b"21");
    // COMPARE_SET quirk and swap.
    r.send(&[&[2], &lp(b"/cs"), &lp(b"exp"), &lp(b"des")]);
    assert_eq!(r.read_value(), b"exp");
    r.send(&[&[2], &lp(b"/cs"), &lp(b""), &lp(b"des")]);
    assert_eq!(r.read_value(), b"des");
    // CHECK
    r.send(&[&[5], &n64(2), &lp(b"/a"), &lp(b"/n")]);
    assert_eq!(r.read(1), [0]);
    r.send(&[&[5], &n64(1), &lp(b"/zzz")]);
    assert_eq!(r.read(1), [1]);
    // WAIT on present keys answers at once.
    r.send(&[&[6], &n64(1), &lp(b"/a")]);
    assert_eq!(r.read(1), [0]);
    // GETNUMKEYS: /a, /n, /cs
    r.send(&[&[7]]);
    assert_eq!(r.read(8), 3i64.to_le_bytes());
    // DELETE_KEY
    r.send(&[&[8], &lp(b"/cs")]);
    assert_eq!(r.read(8), 1i64.to_le_bytes());
    r.send(&[&[8], &lp(b"/cs")]);
    assert_eq!(r.read(8), 0i64.to_le_bytes());
    // APPEND creates then extends.
    r.send(&[&[9], &lp(b"/ap"), &lp(b"ab")]);
    r.send(&[&[9], &lp(b"/ap"), &lp(b"cd")]);
    // MULTI_SET, MULTI_GET
    r.send(&[
        &[11],
        &n64(2),
        &lp(b"/m1"),
        &lp(b"x"),
        &lp(b"/m2"),
        &lp(b"yy"),
    ]);
    r.send(&[&[10], &n64(3), &lp(b"/m2"), &lp(b"/ap"), &lp(b"/m1")]);
    assert_eq!(r.read_value(), b"yy");
    assert_eq!(r.read_value(), b"abcd");
    assert_eq!(r.read_value(), b"x");
    // CANCEL_WAIT with nothing pending is still answered.
    r.send(&[&[12]]);
    assert_eq!(r.read(1), [1]);
    // Queues: FIFO, length before pop, value only when non-empty.
    r.send(&[&[14], &lp(b"/q"), &lp(b"first")]);
    r.send(&[&[14], &lp(b"/q"), &lp(b"second")]);
    r.send(&[&[16], &lp(b"/q")]);
    assert_eq!(r.read(8), 2i64.to_le_bytes());
    r.send(&[&[15], &lp(b"/q")]);
    assert_eq!(r.read(8), 2i64.to_le_bytes());
    assert_eq!(r.read_value(), b"first");
    r.send(&[&[15], &lp(b"/q")]);
    assert_eq!(r.read(8), 1i64.to_le_bytes());
    assert_eq!(r.read_value(), b"second");
    r.send(&[&[15], &lp(b"/q")]);
    assert_eq!(r.read(8), 0i64.to_le_bytes());
    // LIST_KEYS
    r.send(&[&[17]]);
    let n = r.read_u64();
    let mut keys: Vec<Vec<u8>> = (0..n).map(|_| r.read_value()).collect();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            b"/a".to_vec(),
            b"/ap".to_vec(),
            b"/m1".to_vec(),
            b"/m2".to_vec(),
            b"/n".to_vec()
        ]
    );
    // WAIT parks until another connection writes; then BARRIER for 2.
    let mut other = Raw::validated(server.port());
    r.send(&[&[6], &n64(2), &lp(b"/w1"), &lp(b"/w2")]);
    other.send(&[&[1], &lp(b"/w1"), &lp(b"1")]);
    other.send(&[&[7]]);
    assert_eq!(other.read(8), 6i64.to_le_bytes());
    r.0.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(
        r.0.read(&mut b).is_err(),
        "WAIT answered before its last key appeared"
    );
    r.0.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    other.send(&[&[1], &lp(b"/w2"), &lp(b"2")]);
    assert_eq!(r.read(1), [0]);
    r.send(&[&[18], &lp(b"/bar"), &2i64.to_le_bytes()]);
    other.send(&[&[18], &lp(b"/bar"), &2i64.to_le_bytes()]);
    assert_eq!(other.read(1), [0]);
    assert_eq!(r.read(1), [0]);
    // A parked WAIT cancelled: CANCEL_WAIT answered, and the wait never fires.
    r.send(&[&[6], &n64(1), &lp(b"/never")]);
    r.send(&[&[12]]);
    assert_eq!(r.read(1), [1]);
    other.send(&[&[1], &lp(b"/never"), &lp(b"x")]);
    r.send(&[&[13], &7u32.to_le_bytes()]);
    assert_eq!(r.read(4), 7u32.to_le_bytes());
}

#[test]
fn our_client_against_an_independent_server() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut r = Raw(s);
        assert_eq!(r.read(5), [0x00, 0xCE, 0xF7, 0x85, 0x3C], "VALIDATE bytes");
        let ping = r.read(5);
        assert_eq!(ping[0], 13);
        assert_eq!(
            &ping[1..],
            std::process::id().to_le_bytes(),
            "PING carries the pid"
        );
        r.send(&[&ping[1..]]);
        let mut kv = std::collections::HashMap::<Vec<u8>, Vec<u8>>::new();
        let mut seen = Vec::new();
        loop {
            let mut code = [0u8; 1];
            if r.0.read(&mut code).unwrap_or(0) == 0 {
                return seen;
            }
            seen.push(code[0]);
            match code[0] {
                1 => {
                    let k = r.read_value();
                    let v = r.read_value();
                    kv.insert(k, v);
                }
                3 => {
                    let k = r.read_value();
                    let v = kv.get(&k).cloned().unwrap_or_default();
                    r.send(&[&lp(&v)]);
                }
                4 => {
                    let k = r.read_value();
                    let d = i64::from_le_bytes(r.read(8).try_into().unwrap());
                    let cur: i64 = kv
                        .get(&k)
                        .map_or(0, |v| std::str::from_utf8(v).unwrap().parse().unwrap());
                    kv.insert(k, (cur + d).to_string().into_bytes());
                    r.send(&[&(cur + d).to_le_bytes()]);
                }
                6 => {
                    let n = r.read_u64();
                    let keys: Vec<_> = (0..n).map(|_| r.read_value()).collect();
                    assert!(
                        keys.iter().all(|k| kv.contains_key(k)),
                        "test only waits on present keys"
                    );
                    r.send(&[&[0]]);
                }
                13 => {
                    let nonce = r.read(4);
                    r.send(&[&nonce]);
                }
                c => panic!("unexpected query code {c}"),
            }
        }
    });
    {
        let c = TcpStore::new(&TcpStoreOptions::client(
            "localhost",
            port,
            Duration::from_secs(10),
        ))
        .unwrap();
        c.set("k", b"v").unwrap();
        assert_eq!(c.get("k").unwrap(), b"v");
        assert_eq!(c.add("n", 5).unwrap(), 5);
        assert_eq!(
            c.get_raw(b"/n").unwrap(),
            b"5",
            "user keys go out with a leading '/'"
        );
    }
    // SET confirmed by a PING behind it, then GET preceded by WAIT, ADD, GET.
    assert_eq!(fake.join().unwrap(), vec![1, 13, 6, 3, 4, 3]);
}

#[test]
fn bad_requests_close_only_their_connection() {
    let server = TcpStoreServer::start(0).unwrap();
    let port = server.port();
    let mut bystander = Raw::validated(port);
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "first message not VALIDATE",
            [&[1u8][..], &lp(b"/k"), &lp(b"v")].concat(),
            false,
        ),
        ("bad magic", vec![0, 1, 2, 3, 4], false),
        ("unknown opcode", vec![19], true),
        (
            "key over 8 KiB",
            [&[1u8][..], &n64(8 * 1024 + 1)].concat(),
            true,
        ),
        (
            "value over 8 MiB",
            [&[1u8][..], &lp(b"/k"), &n64(8 * 1024 * 1024 + 1)].concat(),
            true,
        ),
        (
            "too many keys",
            [&[6u8][..], &n64(128 * 1024 + 1)].concat(),
            true,
        ),
        (
            "ADD on a non-number",
            [
                &[1u8][..],
                &lp(b"/s"),
                &lp(b"abc"),
                &[4],
                &lp(b"/s"),
                &1i64.to_le_bytes(),
            ]
            .concat(),
            true,
        ),
    ];
    for (what, bytes, validate_first) in cases {
        let mut r = if validate_first {
            Raw::validated(port)
        } else {
            Raw::open(port)
        };
        r.send(&[&bytes]);
        assert!(r.closed(), "{what}: connection should be closed");
        bystander.send(&[&[13], &9u32.to_le_bytes()]);
        assert_eq!(bystander.read(4), 9u32.to_le_bytes(), "{what}: bystander");
    }
    healthy(port);
}

#[test]
fn a_half_sent_request_does_not_stall_others() {
    let server = TcpStoreServer::start(0).unwrap();
    let port = server.port();
    let mut slow = Raw::validated(port);
    // SET "/slow" = "1", sent up to the middle of the key.
    let full = [&[1u8][..], &lp(b"/slow"), &lp(b"1")].concat();
    slow.send(&[&full[..4]]);
    let c = TcpStore::new(&TcpStoreOptions::client(
        "127.0.0.1",
        port,
        Duration::from_secs(5),
    ))
    .unwrap();
    for i in 0..100 {
        c.set(&format!("k{i}"), b"v").unwrap();
    }
    assert!(!c.check(&["slow"]).unwrap());
    // Byte by byte for the rest.
    for b in &full[4..] {
        slow.send(&[&[*b]]);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(c.get("slow").unwrap(), b"1");
    // A big value arriving in pieces, interleaved with other traffic.
    let big = vec![7u8; 3 * 1024 * 1024];
    let msg = [&[1u8][..], &lp(b"/big"), &lp(&big)].concat();
    for chunk in msg.chunks(256 * 1024) {
        slow.send(&[chunk]);
        c.add("ticks", 1).unwrap();
    }
    assert_eq!(c.get("big").unwrap(), big);
}

#[test]
fn holds_1024_connections() {
    torchcomm::store::raise_nofile_limit();
    let server = TcpStoreServer::start(0).unwrap();
    let port = server.port();
    let mut conns: Vec<Raw> = (0..1024).map(|_| Raw::validated(port)).collect();
    // One of them parks in a WAIT that the last one releases.
    conns[0].send(&[&[6], &n64(1), &lp(b"/release")]);
    for (i, c) in conns.iter_mut().enumerate().skip(1) {
        c.send(&[&[4], &lp(b"/count"), &1i64.to_le_bytes()]);
        let _ = i;
    }
    for c in conns.iter_mut().skip(1) {
        let _ = c.read(8);
    }
    conns[1023].send(&[&[1], &lp(b"/release"), &lp(b"x")]);
    assert_eq!(conns[0].read(1), [0]);
    let c = TcpStore::new(&TcpStoreOptions::client(
        "127.0.0.1",
        port,
        Duration::from_secs(10),
    ))
    .unwrap();
    assert_eq!(c.get("count").unwrap(), b"1023");
}

/// xorshift64*: deterministic, so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_request(rng: &mut Rng) -> Vec<u8> {
    use torchcomm::store::Request;
    let key = |rng: &mut Rng| format!("/f{}", rng.below(8)).into_bytes();
    let val = |rng: &mut Rng| {
        let n = rng.below(20) as usize;
        (0..n).map(|_| rng.next() as u8).collect::<Vec<u8>>()
    };
    let req = match rng.below(19) {
        0 => Request::Validate(0x3C85_F7CE),
        1 => Request::Set {
            key: key(rng),
            value: val(rng),
        },
        2 => Request::CompareSet {
            key: key(rng),
            expected: val(rng),
            desired: val(rng),
        },
        3 => Request::Get(key(rng)),
        4 => Request::Add {
            key: b"/counter".to_vec(),
            delta: rng.below(10) as i64,
        },
        5 => Request::Check(vec![key(rng), key(rng)]),
        6 => Request::Wait(vec![key(rng)]),
        7 => Request::GetNumKeys,
        8 => Request::DeleteKey(key(rng)),
        9 => Request::Append {
            key: key(rng),
            value: val(rng),
        },
        10 => Request::MultiGet(vec![key(rng)]),
        11 => Request::MultiSet(vec![(key(rng), val(rng))]),
        12 => Request::CancelWait,
        13 => Request::Ping(rng.next() as u32),
        14 => Request::QueuePush {
            key: key(rng),
            value: val(rng),
        },
        15 => Request::QueuePop(key(rng)),
        16 => Request::QueueLen(key(rng)),
        17 => Request::ListKeys,
        _ => Request::Barrier {
            key: b"/barrier".to_vec(),
            world_size: rng.below(4) as i64,
        },
    };
    req.to_bytes()
}

#[test]
fn fuzz_random_and_truncated_frames() {
    let server = TcpStoreServer::start(0).unwrap();
    let port = server.port();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut open: Vec<Raw> = Vec::new();
    for round in 0..600 {
        let mut r = if rng.below(10) == 0 {
            Raw::open(port)
        } else {
            Raw::validated(port)
        };
        let mut bytes = Vec::new();
        for _ in 0..rng.below(6) {
            bytes.extend(random_request(&mut rng));
        }
        match rng.below(4) {
            // Truncate somewhere.
            0 if !bytes.is_empty() => {
                let cut = rng.below(bytes.len() as u64) as usize;
                bytes.truncate(cut);
            }
            // Flip a few bytes.
            1 if !bytes.is_empty() => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(bytes.len() as u64) as usize;
                    bytes[i] = rng.next() as u8;
                }
            }
            // Pure noise.
            2 => bytes = (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
            _ => {}
        }
        let _ = r.0.write_all(&bytes);
        match rng.below(3) {
            0 => drop(r),
            1 => {
                let _ = r.0.shutdown(Shutdown::Write);
                open.push(r);
            }
            _ => open.push(r),
        }
        if open.len() > 64 {
            open.drain(..32);
        }
        if round % 100 == 99 {
            healthy(port);
        }
    }
    drop(open);
    healthy(port);
}

/// torch's python, through scripts/torch-venv.sh; None (with the SKIPPED
/// line printed) when torch cannot be had here.
fn torch_python() -> Option<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/torch-venv.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .output()
        .unwrap();
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        let line = why
            .lines()
            .find(|l| l.starts_with("SKIPPED"))
            .unwrap_or("SKIPPED: torch unavailable");
        println!("{line}");
        eprintln!("{line}");
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

const TORCH_CLIENT: &str = r#"
import datetime, sys
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
             timeout=datetime.timedelta(seconds=float(sys.argv[2])), wait_for_workers=False)
print(s.get("from_rust").decode())
s.set("from_torch", "hi")
print(s.add("count", 5))
"#;

/// torch's own TCPStore client against our server (loopback, no token), and
/// against a server that requires a token, which it cannot present.
#[test]
fn torch_client_against_our_server_with_and_without_token() {
    let Some(py) = torch_python() else { return };
    let run = |port: u16, timeout_s: &str| {
        std::process::Command::new(&py)
            .args(["-c", TORCH_CLIENT, &port.to_string(), timeout_s])
            .output()
            .unwrap()
    };
    let ours = TcpStore::new(&TcpStoreOptions::server(0, Duration::from_secs(20))).unwrap();
    ours.set("from_rust", b"hello").unwrap();
    let out = run(ours.port(), "20");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().collect::<Vec<_>>(), ["hello", "5"]);
    assert_eq!(ours.get("from_torch").unwrap(), b"hi");

    let mut opts = TcpStoreOptions::server(0, Duration::from_secs(20));
    opts.token = Some(b"secret".to_vec());
    let guarded = TcpStore::new(&opts).unwrap();
    guarded.set("from_rust", b"hidden").unwrap();
    let out = run(guarded.port(), "3");
    assert!(
        !out.status.success(),
        "torch's client got in without the token"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hidden"));
    assert!(!guarded.check(&["from_torch"]).unwrap());
}
