//! The store server with thousands of connections open at once: idle ones,
//! ones parked in a WAIT, ones that sent half a request, and ones that come
//! and go (reusing the server's connection slots) must not disturb a client's
//! requests, and every parked waiter is woken. Correctness only; the timing
//! is `make bench-store`'s.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use torchcomm::store::Request;
use torchcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};

const T: Duration = Duration::from_secs(120);
const IDLE: usize = 2000;
/// The number torch's clients open with (tcpstore-protocol.md).
const TORCH_VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

fn raw(port: u16, first: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting an idle client");
    s.write_all(first).unwrap();
    s
}

fn open_files_limit() -> u64 {
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_cur
}

#[test]
fn two_thousand_open_connections_leave_a_client_served_and_waiters_woken() {
    let server = TcpStoreServer::start(0).unwrap();
    // Client and server ends both live in this process.
    if open_files_limit() < (2 * IDLE + 200) as u64 {
        println!(
            "SKIPPED: the open-files limit ({}) is below {}; this test needs it",
            open_files_limit(),
            2 * IDLE + 200
        );
        return;
    }
    let port = server.port();
    let validate = Request::Validate(TORCH_VALIDATION_MAGIC).to_bytes();
    let mut wait = validate.clone();
    wait.extend(Request::Wait(vec![b"/go".to_vec()]).to_bytes());
    let half = {
        let mut v = validate.clone();
        let get = Request::Get(b"/half".to_vec()).to_bytes();
        v.extend_from_slice(&get[..get.len() / 2]);
        v
    };
    let mut idle: Vec<TcpStream> = (0..IDLE)
        .map(|i| match i % 4 {
            0 => raw(port, &[]),
            1 => raw(port, &validate),
            2 => raw(port, &half),
            _ => raw(port, &wait),
        })
        .collect();
    let c = TcpStore::new(&TcpStoreOptions::client("127.0.0.1", port, T)).unwrap();
    for round in 0..200i64 {
        let key = format!("k{}", round % 7);
        c.set(&key, format!("v{round}").as_bytes()).unwrap();
        assert_eq!(c.get(&key).unwrap(), format!("v{round}").as_bytes());
        assert_eq!(c.add("count", 1).unwrap(), round + 1);
        if round == 100 {
            // Half the waiters and a quarter of the idle clients leave, as
            // many new ones arrive: their server slots are reused.
            for (i, s) in idle.iter_mut().enumerate() {
                if i % 8 == 3 || i % 8 == 0 {
                    *s = raw(port, &validate);
                }
            }
        }
    }
    assert!(!c.check(&["go"]).unwrap());
    c.set("go", b"1").unwrap();
    // Replies are flushed in order: once this is answered, every wakeup
    // the SET caused has reached its socket.
    assert_eq!(c.get("go").unwrap(), b"1");
    let mut woken = 0;
    for (i, s) in idle.iter_mut().enumerate() {
        let mut b = [0u8; 1];
        if i % 8 == 7 {
            s.set_read_timeout(Some(T)).unwrap();
            s.read_exact(&mut b).expect("a parked waiter is woken");
            assert_eq!(b[0], 0, "STOP_WAITING");
            woken += 1;
        } else if i % 8 == 3 {
            // A new occupant of a departed waiter's slot inherits nothing.
            s.set_nonblocking(true).unwrap();
            let got = s.read(&mut b);
            assert!(
                matches!(&got, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
                "connection {i} received {got:?}"
            );
        }
    }
    assert_eq!(woken, IDLE / 8);
    assert_eq!(c.get("count").unwrap(), b"200");
}
