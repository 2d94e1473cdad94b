//! FileStore: the same behaviours as the TCP store, through separately
//! opened handles on one file (as separate processes would have).

use std::time::{Duration, Instant};
use torchcomm::store::{FileStore, PrefixStore, Store};
use torchcomm::ErrorKind;

fn path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tc-filestore-{}-{name}", std::process::id()))
}

#[test]
fn operations_across_handles() {
    let p = path("ops");
    let a = FileStore::new(&p, 2, Duration::from_secs(10)).unwrap();
    let b = FileStore::new(&p, 2, Duration::from_secs(10)).unwrap();
    a.set("key0", b"value0").unwrap();
    assert_eq!(b.get("key0").unwrap(), b"value0");
    a.add("n", 6).unwrap();
    assert_eq!(b.get("n").unwrap(), b"6");
    assert_eq!(b.add("n", 15).unwrap(), 21);
    assert_eq!(a.compare_set("cs", b"x", b"y").unwrap(), b"x");
    assert!(!a.check(&["cs"]).unwrap());
    assert_eq!(a.compare_set("cs", b"", b"1").unwrap(), b"1");
    assert_eq!(b.compare_set("cs", b"1", b"2").unwrap(), b"2");
    a.append("ap", b"ab").unwrap();
    b.append("ap", b"cd").unwrap();
    assert_eq!(a.get("ap").unwrap(), b"abcd");
    assert_eq!(b.num_keys().unwrap(), 4);
    assert!(b.delete("cs").unwrap());
    assert!(!a.check(&["cs"]).unwrap());
    assert_eq!(a.num_keys().unwrap(), 3);
    a.multi_set(&[("m1", b"1"), ("m2", b"2")]).unwrap();
    assert_eq!(
        b.multi_get(&["m2", "m1"]).unwrap(),
        vec![b"2".to_vec(), b"1".to_vec()]
    );
    let pre = PrefixStore::new("pg", b.clone_store().unwrap());
    pre.set("k", b"v").unwrap();
    assert_eq!(a.get("pg/k").unwrap(), b"v");
    drop(pre);
    drop(a);
    assert!(p.exists(), "one of two users left");
    drop(b);
    assert!(!p.exists(), "the last user removes the file");
}

#[test]
fn wait_times_out_and_wakes() {
    let p = path("wait");
    let a = FileStore::new(&p, 1, Duration::from_secs(10)).unwrap();
    let start = Instant::now();
    let err = a
        .wait(&["missing"], Some(Duration::from_millis(250)))
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Timeout);
    assert!(
        err.message.starts_with("wait timeout after 250ms"),
        "{}",
        err.message
    );
    assert!(start.elapsed() < Duration::from_secs(2));
    let b = FileStore::new(&p, -1, Duration::from_secs(10)).unwrap();
    let t = std::thread::spawn(move || b.get("late").unwrap());
    std::thread::sleep(Duration::from_millis(50));
    a.set("late", b"here").unwrap();
    assert_eq!(t.join().unwrap(), b"here");
}

#[test]
fn concurrent_adds_are_exact() {
    let p = path("adds");
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || {
                let s = FileStore::new(&p, 8, Duration::from_secs(10)).unwrap();
                for _ in 0..200 {
                    s.add("c", 1).unwrap();
                }
                s.add("c", 0).unwrap()
            })
        })
        .collect();
    let max = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .max()
        .unwrap();
    assert_eq!(max, 1600);
    assert!(!p.exists());
    assert_eq!(
        FileStore::new(&p, 0, Duration::from_secs(1))
            .err()
            .unwrap()
            .kind,
        ErrorKind::InvalidArgument
    );
}
