//! FileStore: a store in one file on a shared filesystem. The file is an
//! append-only log of records `u8 op ('S' set, 'D' delete), u64 key length,
//! key, u64 value length, value` (little-endian), written under an exclusive
//! `flock` and replayed by every process; waits poll the file.

use crate::error::{Error, Result};
use crate::store::{Store, StoreRef};
use crate::util::lock;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Counter of processes done with the file; the last one removes it.
const CLEANUP_KEY: &str = "cleanup/";

struct Inner {
    file: File,
    /// Bytes of the log replayed into `map`.
    pos: u64,
    map: HashMap<String, Vec<u8>>,
}

/// A store kept in a file. Thread-safe.
pub struct FileStore {
    path: PathBuf,
    world_size: i32,
    timeout: Duration,
    inner: Mutex<Inner>,
    /// Clones do not take part in the cleanup count.
    is_clone: bool,
}

struct Lock<'a>(&'a File);
impl<'a> Lock<'a> {
    fn new(file: &'a File, exclusive: bool) -> Result<Lock<'a>> {
        let op = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        loop {
            if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
                return Ok(Lock(file));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::system("FileStore: flock", e));
            }
        }
    }
}
impl Drop for Lock<'_> {
    fn drop(&mut self) {
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

fn parse_int(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

impl Inner {
    /// Replays records appended since the last call.
    fn catch_up(&mut self, path: &Path) -> Result<()> {
        let mut buf = Vec::new();
        self.file
            .seek(SeekFrom::Start(self.pos))
            .map_err(|e| Error::system(format!("FileStore {}", path.display()), e))?;
        self.file
            .read_to_end(&mut buf)
            .map_err(|e| Error::system(format!("FileStore {}", path.display()), e))?;
        let mut at = 0usize;
        let rd = |b: &[u8], at: usize| -> Option<(Vec<u8>, usize)> {
            let len = u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?) as usize;
            let end = (at + 8).checked_add(len)?;
            Some((b.get(at + 8..end)?.to_vec(), end))
        };
        while at < buf.len() {
            let op = buf[at];
            let Some((k, next)) = rd(&buf, at + 1) else {
                break;
            };
            let Some((v, next)) = rd(&buf, next) else {
                break;
            };
            let key = String::from_utf8_lossy(&k).into_owned();
            match op {
                b'S' => {
                    self.map.insert(key, v);
                }
                b'D' => {
                    self.map.remove(&key);
                }
                _ => {
                    return Err(Error::internal(format!(
                        "FileStore {}: corrupt record at byte {}",
                        path.display(),
                        self.pos + at as u64
                    )))
                }
            }
            at = next;
        }
        self.pos += at as u64;
        Ok(())
    }

    fn append(&mut self, path: &Path, op: u8, key: &str, value: &[u8]) -> Result<()> {
        let mut rec = Vec::with_capacity(17 + key.len() + value.len());
        rec.push(op);
        rec.extend_from_slice(&(key.len() as u64).to_le_bytes());
        rec.extend_from_slice(key.as_bytes());
        rec.extend_from_slice(&(value.len() as u64).to_le_bytes());
        rec.extend_from_slice(value);
        self.file
            .seek(SeekFrom::End(0))
            .map_err(|e| Error::system(format!("FileStore {}", path.display()), e))?;
        self.file
            .write_all(&rec)
            .map_err(|e| Error::system(format!("FileStore {}: write", path.display()), e))?;
        self.file.flush().ok();
        self.catch_up(path)
    }
}

impl FileStore {
    /// Opens (creating) the store file. `world_size` > 0: the last of that
    /// many stores to be dropped removes the file; -1: never removed.
    pub fn new(path: impl AsRef<Path>, world_size: i32, timeout: Duration) -> Result<FileStore> {
        if world_size == 0 || world_size < -1 {
            return Err(Error::invalid_argument(format!(
                "world_size must be positive or -1, not {world_size}"
            )));
        }
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| {
                Error::system(format!("cannot open FileStore file {}", path.display()), e)
            })?;
        Ok(FileStore {
            path,
            world_size,
            timeout,
            inner: Mutex::new(Inner {
                file,
                pos: 0,
                map: HashMap::new(),
            }),
            is_clone: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the up-to-date map under the file lock.
    fn with<T>(
        &self,
        exclusive: bool,
        f: impl FnOnce(&mut Inner, &Path) -> Result<T>,
    ) -> Result<T> {
        let mut inner = lock(&self.inner);
        let file = inner
            .file
            .try_clone()
            .map_err(|e| Error::system("FileStore: dup", e))?;
        let _lock = Lock::new(&file, exclusive)?;
        inner.catch_up(&self.path)?;
        f(&mut inner, &self.path)
    }

    fn add_key(&self, key: &str, delta: i64) -> Result<i64> {
        self.with(true, |inner, path| {
            let cur = match inner.map.get(key) {
                None => 0,
                Some(v) => parse_int(v).ok_or_else(|| {
                    Error::invalid_usage(format!("add: the value of key {key:?} is not an integer"))
                })?,
            };
            let new = cur
                .checked_add(delta)
                .ok_or_else(|| Error::invalid_argument(format!("add: key {key:?} overflows")))?;
            inner.append(path, b'S', key, new.to_string().as_bytes())?;
            Ok(new)
        })
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        if self.is_clone || self.world_size <= 0 {
            return;
        }
        if let Ok(n) = self.add_key(CLEANUP_KEY, 1) {
            if n >= self.world_size as i64 {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.with(true, |inner, path| inner.append(path, b'S', key, value))
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.wait(&[key], None)?;
        self.with(false, |inner, _| {
            Ok(inner.map.get(key).cloned().unwrap_or_default())
        })
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.add_key(key, delta)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.with(true, |inner, path| match inner.map.get(key) {
            None if expected.is_empty() => {
                inner.append(path, b'S', key, desired)?;
                Ok(desired.to_vec())
            }
            None => Ok(expected.to_vec()),
            Some(cur) if cur == expected => {
                inner.append(path, b'S', key, desired)?;
                Ok(desired.to_vec())
            }
            Some(cur) => Ok(cur.clone()),
        })
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.with(false, |inner, _| {
            Ok(keys.iter().all(|k| inner.map.contains_key(*k)))
        })
    }
    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()> {
        let timeout = timeout.unwrap_or(self.timeout);
        let start = Instant::now();
        loop {
            if self.check(keys)? {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                let shown: Vec<String> = keys.iter().map(|k| format!("/{k}")).collect();
                return Err(Error::timeout(format!(
                    "wait timeout after {}ms, keys: {}",
                    timeout.as_millis(),
                    shown.join(", ")
                )));
            }
            std::thread::sleep(
                Duration::from_millis(5).min(timeout.saturating_sub(start.elapsed())),
            );
        }
    }
    fn delete(&self, key: &str) -> Result<bool> {
        self.with(true, |inner, path| {
            if inner.map.contains_key(key) {
                inner.append(path, b'D', key, &[])?;
                Ok(true)
            } else {
                Ok(false)
            }
        })
    }
    fn num_keys(&self) -> Result<i64> {
        self.with(false, |inner, _| {
            Ok(inner
                .map
                .keys()
                .filter(|k| k.as_str() != CLEANUP_KEY)
                .count() as i64)
        })
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.with(true, |inner, path| {
            let mut v = inner.map.get(key).cloned().unwrap_or_default();
            v.extend_from_slice(value);
            inner.append(path, b'S', key, &v)
        })
    }
    fn clone_store(&self) -> Result<StoreRef> {
        let mut s = FileStore::new(&self.path, self.world_size, self.timeout)?;
        s.is_clone = true;
        Ok(Arc::new(s))
    }
}
