//! One rank of the UCX-between-hosts test (`scripts/test-ucx-hosts.sh`,
//! which makes the hosts out of network namespaces and starts this program
//! once per rank, with `TORCHCOMM_HOST_TRANSPORT=ucx` and `UCX_TLS=tcp,self`
//! so that UCX cannot reach across "hosts" through shared memory).
//!
//! `TC_UCX_MODE` chooses what it checks:
//!
//! - `ops`: three gloo comms over one TCP store (rank 0 hosts it at
//!   `MASTER_ADDR:MASTER_PORT`): "ucx" (hierarchical where a host has
//!   several ranks: UCX carries the leaders' step), "ucxflat" (hint
//!   `gloo.hier=0`: UCX among all ranks) and "gloo" (hint
//!   `gloo.host_transport=gloo`, flat: the reference). First the bytes of a
//!   4 MiB all_reduce on "ucxflat" must cross between hosts (`tx_bytes` of
//!   `TC_IFACE`: UCX did not find a way around the network), then every
//!   operation x dtype x reduce op of `tests/ucx_checks` on both UCX comms
//!   (integers bit for bit against "gloo", floats against a reference) and
//!   point-to-point on "ucxflat";
//! - `fault`: the last rank kills itself (SIGKILL) during a stream of
//!   all_reduces on a UCX comm ("ucxflat", or the hierarchical one with
//!   `TC_UCX_FAULT_HIER=1`) whose timeout is 20 s: every survivor must fail
//!   within `TC_UCX_FAULT_LIMIT_S` (default 5) seconds with an error naming
//!   the dead rank;
//! - `window`: a window on a flat UCX comm ("ucxwin"): every rank puts
//!   40000 bytes into every other rank's buffer and signals it, waits for
//!   every peer's signal, checks its buffer byte by byte, then gets back
//!   what it put into every peer; the bytes must have crossed the host's
//!   link (the script checks the INFO line of a UCX window);
//! - `hidden`: UCX hidden from the loader (`TORCHCOMM_UCX_LIBRARY` names a
//!   library that does not exist): the comm must run on Gloo (its version
//!   says no UCX) and get an all_reduce right; the script checks the INFO
//!   line.
//!
//! Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TC_HOST (this
//! rank's host number), TC_IFACE. Exit status 0 when all is right; a failed
//! check panics (exit status 101) naming what was wrong.

mod hosts;
#[path = "../../tests/ucx_checks/mod.rs"]
mod ucx_checks;

use hosts::{env, submit, total_over_hosts, tx_bytes};

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchcomm::store::{StoreRef, TcpStore, TcpStoreOptions, TcpStoreServer};
use torchcomm::{Comm, CommOptions, Op, OpOptions, Ptr, Window};
use torchcomm::{DType, Device, ReduceOp};

struct Rank {
    me: usize,
    n: usize,
    host: usize,
    store: StoreRef,
}

impl Rank {
    fn comm(&self, name: &str, hints: &[(&str, &str)], timeout: Duration) -> Arc<Comm> {
        Comm::new(
            "gloo",
            Device::Cpu,
            CommOptions {
                name: Some(name.into()),
                timeout: Some(timeout),
                abort_on_error: Some(false),
                rank: Some(self.me as i32),
                world_size: Some(self.n as i32),
                store: Some(self.store.clone()),
                hints: hints
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
        )
        .unwrap_or_else(|e| panic!("rank {}: comm {name}: {}", self.me, e.message))
    }

    /// Every rank says it is done; rank 0 (the store's host) waits for all
    /// of them (or for `keys` ranks) before it leaves.
    fn leave(&self, ranks: &[usize], timeout: Duration) {
        let _ = self.store.set(&format!("done/{}", self.me), b"1");
        if self.me == 0 {
            let keys: Vec<String> = ranks.iter().map(|r| format!("done/{r}")).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            self.store
                .wait(&keys, Some(timeout))
                .expect("every rank done");
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

fn version(c: &Comm) -> String {
    c.backend_version().to_string_lossy().into_owned()
}

fn all_reduce_f32(v: &mut [f32]) -> Op {
    let count = v.len();
    Op::all_reduce(
        Ptr(v.as_mut_ptr() as *mut c_void),
        count,
        DType::F32,
        ReduceOp::SUM,
    )
}

/// The bytes every host sent while a 4 MiB all_reduce ran on `comm`
/// (each host's first rank reads its link's counter; the sum over hosts).
fn crossed_between_hosts(r: &Rank, comm: &Comm) -> u64 {
    let mut v = vec![1.0f32; 1 << 20];
    submit(comm, Op::Barrier);
    let before = tx_bytes("TC_IFACE");
    submit(comm, Op::Barrier);
    submit(comm, all_reduce_f32(&mut v));
    submit(comm, Op::Barrier);
    let mine = tx_bytes("TC_IFACE") - before;
    assert!(
        v.iter().all(|x| *x == r.n as f32),
        "all_reduce: {} not {}",
        v[0],
        r.n
    );
    total_over_hosts(comm, r.host, mine)
}

fn ops(r: &Rank) {
    let t = Duration::from_secs(120);
    let ucx = r.comm("ucx", &[("gloo.host_transport", "ucx")], t);
    let flat = r.comm(
        "ucxflat",
        &[("gloo.host_transport", "ucx"), ("gloo.hier", "0")],
        t,
    );
    let gloo = r.comm(
        "gloo",
        &[("gloo.host_transport", "gloo"), ("gloo.hier", "0")],
        t,
    );
    assert!(version(&flat).contains("UCX 1."), "{}", version(&flat));
    // The hierarchical comm carries what its hierarchy does not cover
    // (point-to-point, gather, scatter, all_to_all) over UCX too.
    assert!(version(&ucx).contains("UCX 1."), "{}", version(&ucx));
    assert!(!version(&gloo).contains("UCX"), "{}", version(&gloo));
    // The ring all_reduce sends 2 (n-1)/n of the buffer per rank; at
    // least half of that crosses between hosts in every layout here.
    let crossed = crossed_between_hosts(r, &flat);
    let want = (4u64 << 20) * (r.n as u64 - 1) / r.n as u64;
    assert!(
        crossed >= want,
        "a 4 MiB all_reduce over UCX sent {crossed} bytes between hosts, expected >= {want}: \
         UCX did not use the network"
    );
    if r.me == 0 {
        println!("rank 0: a 4 MiB all_reduce over UCX sent {crossed} bytes between hosts");
    }
    let start = Instant::now();
    ucx_checks::check_p2p(&flat, r.me, r.n);
    ucx_checks::check_p2p(&ucx, r.me, r.n);
    ucx_checks::check_movers(&flat, r.me, r.n);
    ucx_checks::check_movers(&ucx, r.me, r.n);
    ucx_checks::check_reductions(&flat, &gloo, r.me, r.n);
    ucx_checks::check_reductions(&ucx, &gloo, r.me, r.n);
    ucx_checks::check_v(&flat, &gloo, r.me, r.n);
    if r.me == 0 {
        println!(
            "rank 0: every check right on the flat and the hierarchical UCX comm ({:.1} s)",
            start.elapsed().as_secs_f64()
        );
    }
    // check_p2p leaves a mismatched receive behind on purpose.
    if let Err(e) = flat.finalize() {
        assert!(e.message.contains("does not match"), "{}", e.message);
    }
    if let Err(e) = ucx.finalize() {
        assert!(e.message.contains("does not match"), "{}", e.message);
    }
    gloo.finalize().unwrap();
    r.leave(&(0..r.n).collect::<Vec<_>>(), t);
}

fn fault(r: &Rank) {
    const TIMEOUT: Duration = Duration::from_secs(20);
    let limit = Duration::from_secs(
        std::env::var("TC_UCX_FAULT_LIMIT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5),
    );
    let hier = std::env::var("TC_UCX_FAULT_HIER").is_ok_and(|v| v == "1");
    let hints: &[(&str, &str)] = match hier {
        true => &[("gloo.host_transport", "ucx")],
        false => &[("gloo.host_transport", "ucx"), ("gloo.hier", "0")],
    };
    let comm = r.comm("killed", hints, TIMEOUT);
    let victim = r.n - 1;
    submit(&comm, Op::Barrier);
    if r.me == victim {
        println!("rank {victim}: FAULT killing itself in 300 ms");
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        });
    }
    let mut v = vec![1.0f32; 1 << 18];
    let outcome = loop {
        let start = Instant::now();
        if let Err(e) = comm.submit(all_reduce_f32(&mut v), &OpOptions::default()) {
            break (start.elapsed(), e);
        }
    };
    let (took, e) = outcome;
    println!(
        "rank {}: FAULT seen after {:.2} s: {:?}: {}",
        r.me,
        took.as_secs_f64(),
        e.kind,
        e.message
    );
    let named = e.message.contains(&format!("rank {victim}"));
    let _ = r.store.set(&format!("done/{}", r.me), b"1");
    if r.me == 0 {
        let keys: Vec<String> = (0..victim).map(|q| format!("done/{q}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let _ = r.store.wait(&keys, Some(TIMEOUT * 2));
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        took < limit,
        "rank {}: the error came after {took:?} (limit {limit:?}, timeout {TIMEOUT:?}): {}",
        r.me,
        e.message
    );
    assert!(
        named,
        "rank {}: the error does not name rank {victim}: {}",
        r.me, e.message
    );
}

fn window(r: &Rank) {
    const SLOT: usize = 64 * 1024;
    const BIG: usize = 40_000;
    const FILL: u8 = 0xee;
    let t = Duration::from_secs(60);
    let comm = r.comm(
        "ucxwin",
        &[("gloo.host_transport", "ucx"), ("gloo.hier", "0")],
        t,
    );
    let win = Window::new(&comm).unwrap();
    let mut mem = vec![FILL; r.n * SLOT];
    win.register(mem.as_mut_ptr() as *mut c_void, mem.len())
        .unwrap();
    let o = OpOptions::default();
    let byte = |from: usize, to: usize, i: usize| {
        ((from * 37 + to * 11 + i * 7 + i / 251) % 251) as u8 + 1
    };
    let block =
        |from: usize, to: usize| -> Vec<u8> { (0..BIG).map(|i| byte(from, to, i)).collect() };
    let peers: Vec<usize> = (0..r.n).filter(|p| *p != r.me).collect();
    submit(&comm, Op::Barrier);
    let before = tx_bytes("TC_IFACE");
    for &p in &peers {
        let b = block(r.me, p);
        win.put(b.as_ptr() as *const c_void, BIG, p as i32, r.me * SLOT, &o)
            .unwrap();
        win.signal(p as i32, &o).unwrap();
    }
    for &p in &peers {
        win.wait_signal(p as i32, &o).unwrap();
    }
    for s in 0..r.n {
        let slot = &mem[s * SLOT..(s + 1) * SLOT];
        for (i, b) in slot.iter().enumerate() {
            let want = match s != r.me && i < BIG {
                true => byte(s, r.me, i),
                false => FILL,
            };
            assert_eq!(*b, want, "rank {}: byte {i} of rank {s}'s slot", r.me);
        }
    }
    for &p in &peers {
        let mut got = vec![0u8; BIG];
        win.get(
            got.as_mut_ptr() as *mut c_void,
            BIG,
            p as i32,
            r.me * SLOT,
            &o,
        )
        .unwrap();
        assert!(got == block(r.me, p), "rank {}: get from rank {p}", r.me);
    }
    let mine = tx_bytes("TC_IFACE") - before;
    println!(
        "rank {}: WINDOW every pair right; {mine} bytes left this host",
        r.me
    );
    assert!(
        mine >= BIG as u64,
        "rank {}: only {mine} bytes crossed",
        r.me
    );
    win.deregister().unwrap();
    drop(win);
    comm.finalize().unwrap();
    r.leave(&(0..r.n).collect::<Vec<_>>(), t);
}

fn hidden(r: &Rank) {
    let t = Duration::from_secs(60);
    let comm = r.comm("hidden", &[("gloo.host_transport", "ucx")], t);
    assert!(!version(&comm).contains("UCX"), "{}", version(&comm));
    let mut v = vec![r.me as f32 + 1.0; 1000];
    submit(&comm, all_reduce_f32(&mut v));
    let want = (r.n * (r.n + 1) / 2) as f32;
    assert!(v.iter().all(|x| *x == want), "{} not {want}", v[0]);
    comm.finalize().unwrap();
    r.leave(&(0..r.n).collect::<Vec<_>>(), t);
}

fn main() {
    let me: usize = env("RANK").parse().unwrap();
    let n: usize = env("WORLD_SIZE").parse().unwrap();
    let host: usize = env("TC_HOST").parse().unwrap();
    let port: u16 = env("MASTER_PORT").parse().unwrap();
    let timeout = Duration::from_secs(60);
    let _server = (me == 0).then(|| TcpStoreServer::start(port).expect("the store server"));
    let mut opts = TcpStoreOptions::client(&env("MASTER_ADDR"), port, timeout);
    opts.wait_for_workers = false;
    let store: StoreRef = Arc::new(TcpStore::new(&opts).expect("the store"));
    let r = Rank { me, n, host, store };
    match env("TC_UCX_MODE").as_str() {
        "ops" => ops(&r),
        "fault" => fault(&r),
        "hidden" => hidden(&r),
        "window" => window(&r),
        m => panic!("TC_UCX_MODE is '{m}'; it takes ops, fault, window or hidden"),
    }
    println!("rank {me}: all right");
}
