//! The driver layer's tests (by `cuda::tests`, as `make sim-gpu-test` runs
//! them against the simulated driver).

use super::driver::{drv, CUDA_ERROR_NOT_INITIALIZED, MISSING_ENTRY_POINT};
use super::*;
use crate::error::ErrorKind;

#[test]
fn unknown_result_codes_are_plain_numbers() {
    // A code no CUDA version defines: with the `CUresult` enum this
    // value could not even be received; here it is reported.
    let e = check(987_654, "cuTest").expect_err("non-zero is an error");
    assert_eq!(e.kind, ErrorKind::Cuda);
    assert!(
        e.message.contains("cuTest failed") && e.message.contains("987654"),
        "{}",
        e.message
    );
    let e = check(MISSING_ENTRY_POINT, "cuTest").expect_err("missing entry point");
    assert!(e.message.contains("does not export"), "{}", e.message);
    if available().is_err() {
        // Without a driver the table is never loaded: calls fail cleanly.
        assert_eq!(
            unsafe { drv::cuEventQuery(std::ptr::null_mut()) },
            CUDA_ERROR_NOT_INITIALIZED
        );
    }
}

/// With a driver (a GPU, or the simulated one of `make sim-gpu-test`):
/// data put on the device by `DeviceBuffer::zeroed` and `copy_to_device`
/// is there for work issued next on a non-blocking stream. Both used to
/// return with the legacy stream's memset/copy possibly still in flight.
#[test]
fn device_writes_are_visible_on_a_non_blocking_stream() {
    if available().is_err() || device_count().map_or(true, |n| n < 1) {
        return;
    }
    let dev = Device::open(0).unwrap();
    let _g = dev.scoped().unwrap();
    let stream = Stream::new(&dev, 0).unwrap();
    let bytes = 1 << 16;
    let buf = DeviceBuffer::zeroed(&dev, bytes).unwrap();
    let pinned = PinnedBuffer::new(&dev, bytes).unwrap();
    let read_back = || -> Vec<u8> {
        memcpy_async(pinned.ptr(), buf.ptr(), bytes, stream.raw()).unwrap();
        stream_synchronize(stream.raw()).unwrap();
        // SAFETY: pinned host memory of `bytes` bytes, the copy completed.
        unsafe { std::slice::from_raw_parts(pinned.ptr() as *const u8, bytes) }.to_vec()
    };
    assert!(
        read_back().iter().all(|&b| b == 0),
        "zeroed buffer not zero on another stream"
    );
    let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    copy_to_device(buf.ptr(), &data).unwrap();
    assert!(
        read_back() == data,
        "copy_to_device data not on the device for another stream"
    );
}

/// With a driver: plain host memory is not device-accessible; device
/// and pinned memory are.
#[test]
fn device_accessibility_of_pointers() {
    if available().is_err() || device_count().map_or(true, |n| n < 1) {
        return;
    }
    let dev = Device::open(0).unwrap();
    let _g = dev.scoped().unwrap();
    let plain = [0u8; 64];
    assert!(!device_accessible(plain.as_ptr().cast()).unwrap());
    let d = DeviceBuffer::zeroed(&dev, 64).unwrap();
    assert!(device_accessible(d.ptr()).unwrap());
    // SAFETY: an interior address of the allocation.
    assert!(device_accessible(unsafe { d.ptr().cast::<u8>().add(32) }.cast()).unwrap());
    let p = PinnedBuffer::new(&dev, 64).unwrap();
    assert!(device_accessible(p.ptr()).unwrap());
}

/// With a driver: querying an event recorded outside a capture, from a
/// thread that is capturing another stream, neither fails nor
/// invalidates that capture (the query runs in relaxed mode).
#[test]
fn event_query_does_not_disturb_a_capture() {
    if available().is_err() || device_count().map_or(true, |n| n < 1) {
        return;
    }
    let dev = Device::open(0).unwrap();
    let _g = dev.scoped().unwrap();
    let (a, b) = (Stream::new(&dev, 0).unwrap(), Stream::new(&dev, 0).unwrap());
    let pool = EventPool::new(&dev);
    let e = pool.get().unwrap();
    e.record(a.raw()).unwrap();
    stream_synchronize(a.raw()).unwrap();
    begin_capture(b.raw()).unwrap();
    let q = e.query();
    let end = GraphExec::end_capture(&dev, b.raw());
    assert!(
        q.as_ref().is_ok_and(|done| *done),
        "query during a capture: {:?}",
        q.err().map(|e| e.message)
    );
    assert!(
        end.is_ok(),
        "the capture was invalidated: {:?}",
        end.err().map(|e| e.message)
    );
}

/// With a driver: `with_relaxed_capture_mode` runs its closure in the
/// relaxed capture interaction mode and puts the thread's own mode back
/// after it, also when the closure panics.
#[test]
fn relaxed_capture_mode_is_restored_also_after_a_panic() {
    if available().is_err() || device_count().map_or(true, |n| n < 1) {
        return;
    }
    const THREAD_LOCAL: u32 = 1;
    const RELAXED: u32 = 2;
    // Sets this thread's mode to `mode` and returns the one it had.
    let exchange = |mode: u32| {
        let mut m = mode;
        // SAFETY: valid in/out pointer to a mode value.
        assert_eq!(unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut m) }, 0);
        m
    };
    let own = exchange(THREAD_LOCAL);
    let inside = with_relaxed_capture_mode(|| {
        let m = exchange(RELAXED);
        assert_eq!(exchange(m), RELAXED);
        m
    });
    assert_eq!(inside, RELAXED, "the closure did not run in relaxed mode");
    assert_eq!(exchange(THREAD_LOCAL), THREAD_LOCAL, "not restored");
    let unwound = std::panic::catch_unwind(|| with_relaxed_capture_mode(|| panic!("inside")));
    assert!(unwound.is_err());
    assert_eq!(exchange(own), THREAD_LOCAL, "not restored after a panic");
}

#[test]
fn missing_driver_is_unavailable_not_a_panic() {
    // On machines without a driver this is the path under test; with a
    // driver it must simply succeed.
    match available() {
        Ok(()) => assert!(device_count().is_ok()),
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::Unavailable, "{}", e.message);
            assert!(e.message.contains("libcuda"), "{}", e.message);
            assert!(device_count().is_err());
        }
    }
}

/// The stack check answers yes only for bytes wholly inside the caller's
/// live frames, on the main thread as on another; never for the heap or
/// static memory, nor for a range that runs past the stack's top.
#[test]
fn only_the_callers_stack_counts_as_its_stack() {
    // A frame below the buffer's, as the library's calls are.
    #[inline(never)]
    fn on_callers_stack(p: *const std::ffi::c_void, bytes: usize) -> bool {
        super::on_callers_stack(p, bytes)
    }
    fn check() {
        let local = [0u64; 4];
        let p = local.as_ptr().cast::<std::ffi::c_void>();
        assert!(on_callers_stack(p, 32));
        assert!(on_callers_stack(p, 0));
        assert!(!on_callers_stack(p, usize::MAX), "past the top");
        let heap = Box::new([0u64; 4]);
        assert!(!on_callers_stack(heap.as_ptr().cast(), 32));
        static GLOBAL: [u64; 4] = [0; 4];
        assert!(!on_callers_stack(GLOBAL.as_ptr().cast(), 32));
    }
    check();
    std::thread::spawn(check).join().unwrap();
}
