/* Stream-capture rules of the simulated driver that CUDA documents (a test
   of the simulation, calling the simulated libcuda directly):
   - fork/join inside a capture is legal: a stream that waits on an event
     recorded by the capturing stream joins the capture, its work becomes
     part of the graph, and it must be joined back (the origin waits on an
     event recorded on it) before the capture ends, else
     CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
   - the legacy stream used while a blocking stream captures is
     CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates that capture;
   - a capturing stream waiting on an event recorded outside the capture is
     CUDA_ERROR_STREAM_CAPTURE_ISOLATION and invalidates it (legal with
     CU_EVENT_WAIT_EXTERNAL).
   Prints "N passed, N failed". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda.h"

static int passed, failed;
static void expect(int ok, const char *what) {
    if (ok) passed++;
    else { failed++; fprintf(stderr, "FAIL %s\n", what); }
}
#define CK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { fprintf(stderr, "%s: %d\n", #call, (int)r_); exit(2); } } while (0)

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUstream s1, s2, blocking;
    CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&blocking, 0));
    CUevent fork, join, outside;
    CK(cuEventCreate(&fork, 0));
    CK(cuEventCreate(&join, 0));
    CK(cuEventCreate(&outside, 0));
    CUdeviceptr a, b, c;
    CK(cuMemAlloc(&a, 64));
    CK(cuMemAlloc(&b, 64));
    CK(cuMemAlloc(&c, 64));
    unsigned char h[64];
    for (int i = 0; i < 64; i++) h[i] = (unsigned char)i;
    CK(cuMemcpyHtoD(a, h, 64));
    /* a copy from pageable memory returns once staged; the non-blocking
       streams below do not order after the legacy stream, so wait here */
    CK(cuStreamSynchronize(NULL));

    /* fork / join: s1 copies a -> b, s2 (forked) copies a -> c */
    CK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuEventRecord(fork, s1));
    expect(cuStreamWaitEvent(s2, fork, 0) == CUDA_SUCCESS, "fork: a stream waits on an event of the capture");
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CK(cuStreamIsCapturing(s2, &st));
    expect(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "the forked stream is capturing");
    CK(cuMemcpyDtoDAsync(b, a, 64, s1));
    CK(cuMemcpyDtoDAsync(c, a, 64, s2));
    CK(cuEventRecord(join, s2));
    CK(cuStreamWaitEvent(s1, join, 0));
    CUgraph g = NULL;
    expect(cuStreamEndCapture(s1, &g) == CUDA_SUCCESS && g, "a joined fork ends the capture");
    CK(cuStreamIsCapturing(s2, &st));
    expect(st == CU_STREAM_CAPTURE_STATUS_NONE, "the forked stream left the capture");
    CUgraphExec x;
    CK(cuGraphInstantiate(&x, g, 0));
    CK(cuGraphLaunch(x, s1));
    CK(cuStreamSynchronize(s1));
    unsigned char hb[64], hc[64];
    CK(cuMemcpyDtoH(hb, b, 64));
    CK(cuMemcpyDtoH(hc, c, 64));
    expect(hb[63] == 63 && hc[63] == 63, "the replay ran the work of both streams");
    CK(cuGraphExecDestroy(x));
    CK(cuGraphDestroy(g));

    /* a fork never joined back */
    CK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuEventRecord(fork, s1));
    CK(cuStreamWaitEvent(s2, fork, 0));
    CK(cuMemcpyDtoDAsync(c, a, 64, s2));
    g = NULL;
    expect(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_UNJOINED && !g, "an unjoined fork fails the capture");

    /* the legacy stream while a blocking stream captures */
    CK(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
    expect(cuMemcpyDtoDAsync(b, a, 64, NULL) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
           "legacy-stream work while a blocking stream captures is refused");
    g = NULL;
    expect(cuStreamEndCapture(blocking, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !g, "... and invalidates that capture");
    expect(cuMemcpyDtoDAsync(b, a, 64, NULL) == CUDA_SUCCESS, "the legacy stream works again after the capture");

    /* an event recorded outside the capture */
    CK(cuEventRecord(outside, s2));
    CK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    expect(cuStreamWaitEvent(s1, outside, 0) == CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
           "a capturing stream waiting on a non-captured event is refused");
    g = NULL;
    expect(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !g, "... and invalidates the capture");
    CK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    expect(cuStreamWaitEvent(s1, outside, 1 /* CU_EVENT_WAIT_EXTERNAL */) == CUDA_SUCCESS, "... legal as an external wait");
    g = NULL;
    expect(cuStreamEndCapture(s1, &g) == CUDA_SUCCESS && g, "the capture with an external wait ends");
    if (g) CK(cuGraphDestroy(g));

    CK(cuStreamSynchronize(NULL));
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
