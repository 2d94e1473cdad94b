//! `tc_broadcast_coalesced` with real processes: a mixed-dtype list (empty
//! buffers, buffers larger than a bucket) from every root, blocking and
//! asynchronous, every byte checked; a list that differs on one rank fails
//! every rank naming the difference, writes nothing, and leaves the comm
//! usable.

mod capi_common;
#[macro_use]
mod gloo_common;

use capi_common::{finalize_and_destroy, last_error, new_comm};
use gloo_common::*;
use std::ffi::c_void;
use torchcomm::capi::*;

const POISON: u8 = 0xa5;

/// (count, dtype) of the list: three dtypes interleaved, empty entries, and
/// entries larger than the 4 KiB buckets the test uses.
fn list() -> Vec<(usize, tc_dtype_t)> {
    let dts = [TC_FLOAT32, TC_FLOAT16, TC_BFLOAT16, TC_INT64, TC_UINT8];
    (0..23)
        .map(|i| {
            let count = match i % 7 {
                3 => 0,
                5 => 3000 + i * 17,
                _ => 1 + i * 37,
            };
            (count, dts[(i * 3) % dts.len()])
        })
        .collect()
}

fn elem_size(dt: tc_dtype_t) -> usize {
    match dt {
        TC_FLOAT32 => 4,
        TC_FLOAT16 | TC_BFLOAT16 => 2,
        TC_INT64 => 8,
        _ => 1,
    }
}

fn pattern(root: usize, buf: usize, byte: usize) -> u8 {
    ((root * 131 + buf * 29 + byte * 7) % 251) as u8
}

struct Lists {
    data: Vec<Vec<u8>>,
    counts: Vec<usize>,
    dtypes: Vec<tc_dtype_t>,
}

impl Lists {
    fn new(layout: &[(usize, tc_dtype_t)], root: usize, me: usize) -> Lists {
        let data = layout
            .iter()
            .enumerate()
            .map(|(b, &(c, dt))| {
                (0..c * elem_size(dt))
                    .map(|i| {
                        if me == root {
                            pattern(root, b, i)
                        } else {
                            POISON
                        }
                    })
                    .collect()
            })
            .collect();
        Lists {
            data,
            counts: layout.iter().map(|l| l.0).collect(),
            dtypes: layout.iter().map(|l| l.1).collect(),
        }
    }
    fn ptrs(&mut self) -> Vec<*mut c_void> {
        self.data
            .iter_mut()
            .map(|d| d.as_mut_ptr().cast())
            .collect()
    }
    fn check(&self, root: usize) {
        for (b, d) in self.data.iter().enumerate() {
            for (i, &x) in d.iter().enumerate() {
                assert_eq!(
                    x,
                    pattern(root, b, i),
                    "buffer {b} byte {i} from root {root}"
                );
            }
        }
    }
    fn untouched(&self) -> bool {
        self.data.iter().all(|d| d.iter().all(|&x| x == POISON))
    }
}

fn bcast(comm: *mut tc_comm_t, l: &mut Lists, bucket: usize, root: usize, async_op: bool) -> i32 {
    let mut opts = tc_op_options_t::defaults();
    opts.async_op = async_op as i32;
    let ptrs = l.ptrs();
    let mut work: *mut tc_work_t = std::ptr::null_mut();
    let rc = tc_broadcast_coalesced(
        comm,
        ptrs.as_ptr(),
        l.counts.as_ptr(),
        l.dtypes.as_ptr(),
        ptrs.len(),
        bucket,
        root as i32,
        &opts,
        &mut work,
    );
    if rc != TC_SUCCESS {
        return rc;
    }
    let rc = tc_work_wait(work, std::ptr::null_mut());
    tc_work_free(work);
    rc
}

fn every_root_child() {
    let comm = new_comm("coalesced");
    let (me, n) = (rank() as usize, size() as usize);
    for async_op in [false, true] {
        for root in 0..n {
            for bucket in [4096, 1 << 20] {
                let mut l = Lists::new(&list(), root, me);
                assert_eq!(
                    bcast(comm, &mut l, bucket, root, async_op),
                    TC_SUCCESS,
                    "{}",
                    last_error()
                );
                l.check(root);
            }
        }
    }
    // An empty list and a list of empty buffers are fine too.
    let mut l = Lists::new(&[], 0, me);
    assert_eq!(
        bcast(comm, &mut l, 64, 0, false),
        TC_SUCCESS,
        "{}",
        last_error()
    );
    let mut l = Lists::new(&[(0, TC_FLOAT32), (0, TC_FLOAT16)], 0, me);
    assert_eq!(
        bcast(comm, &mut l, 64, 0, true),
        TC_SUCCESS,
        "{}",
        last_error()
    );
    finalize_and_destroy(comm);
    println!("RESULT coalesced ok");
}

fn mismatch_child() {
    let comm = new_comm("coalesced-mismatch");
    let (me, n) = (rank() as usize, size() as usize);
    let root = n - 1;
    let mut layout = list();
    if me == 0 {
        layout[4].0 += 1;
    }
    let mut l = Lists::new(&layout, root, me);
    assert_eq!(
        bcast(comm, &mut l, 4096, root, me % 2 == 1),
        TC_ERR_INVALID_USAGE
    );
    let msg = last_error();
    let expected = "entry 4: rank 0 has 150 elements of bfloat16, rank 1 has 149";
    assert!(msg.contains(expected), "{msg}");
    if me != root {
        assert!(l.untouched(), "a buffer was written");
    }
    // A different root on one rank is named as such.
    let mut l = Lists::new(&list(), 0, me);
    let r = me % 2;
    let rc = bcast(comm, &mut l, 4096, r, false);
    if n > 1 {
        assert_eq!(rc, TC_ERR_INVALID_USAGE);
        assert!(
            last_error().contains("root is 0 on rank 0 but 1 on rank 1"),
            "{}",
            last_error()
        );
    }
    // The comm stays usable.
    let mut l = Lists::new(&list(), 0, me);
    assert_eq!(
        bcast(comm, &mut l, 4096, 0, false),
        TC_SUCCESS,
        "{}",
        last_error()
    );
    l.check(0);
    finalize_and_destroy(comm);
    println!("RESULT mismatch ok");
}

world_tests! {
    coalesced_every_root_world_1: "every_root", every_root_child, 1;
    coalesced_every_root_world_2: "every_root", every_root_child, 2;
    coalesced_every_root_world_3: "every_root", every_root_child, 3;
    coalesced_every_root_world_4: "every_root", every_root_child, 4;
    coalesced_mismatch_world_2: "mismatch", mismatch_child, 2;
    coalesced_mismatch_world_3: "mismatch", mismatch_child, 3;
    coalesced_mismatch_world_4: "mismatch", mismatch_child, 4;
}
