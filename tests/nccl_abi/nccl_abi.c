/* Prints, from a real nccl.h, the layout and constants that the Rust loader
   (src/nccl_loader/mod.rs) hard-codes, one "key value" line each:

     header NCCL_VERSION_CODE 22809
     sizeof ncclConfig_t 80
     offsetof ncclConfig_t.blocking 16
     init ncclConfig_t.blocking -2147483648    (NCCL_CONFIG_INITIALIZER's value)
     const ncclSum 0

   The loader's ABI test (`abi_matches_the_nccl_header` in loader/tests.rs) compiles
   and runs this program against the header named by
   TORCHCOMM_TEST_NCCL_HEADER and compares every line with the Rust side.
   Built with tests/nccl_abi/cuda_stub first on the include path, so no CUDA
   toolkit is needed. Items that exist only from some NCCL version on are
   guarded by NCCL_VERSION_CODE (checked against the 2.27.7 to 2.32.3 wheels). */
#include <stddef.h>
#include <stdio.h>
#include <nccl.h>

#define V(x) printf("const %s %lld\n", #x, (long long)(x))
#define SIZE(t) printf("sizeof %s %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(t, f))
#define CFG(f) do { OFF(ncclConfig_t, f); printf("init ncclConfig_t.%s %lld\n", #f, (long long)init.f); } while (0)
#define CFGP(f) do { OFF(ncclConfig_t, f); printf("init ncclConfig_t.%s %lld\n", #f, (long long)(init.f != NULL)); } while (0)

int main(void) {
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;

    printf("header NCCL_VERSION_CODE %d\n", NCCL_VERSION_CODE);
    printf("header NCCL_VERSION(2,28,9) %d\n", NCCL_VERSION(2, 28, 9));
    printf("header NCCL_VERSION(2,8,4) %d\n", NCCL_VERSION(2, 8, 4));

    SIZE(ncclUniqueId);
    printf("const NCCL_UNIQUE_ID_BYTES %d\n", NCCL_UNIQUE_ID_BYTES);
    SIZE(ncclComm_t);
    SIZE(ncclResult_t);
    SIZE(ncclDataType_t);
    SIZE(ncclRedOp_t);
    SIZE(ncclScalarResidence_t);

    /* ncclConfig_t: every field, its offset and its initializer value. */
    SIZE(ncclConfig_t);
    CFG(size);
    CFG(magic);
    CFG(version);
    CFG(blocking);
    CFG(cgaClusterSize);
    CFG(minCTAs);
    CFG(maxCTAs);
    CFGP(netName);
    CFG(splitShare);
    CFG(trafficClass);
    CFGP(commName);
    CFG(collnetEnable);
    CFG(CTAPolicy);
    CFG(shrinkShare);
    CFG(nvlsCTAs);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    CFG(nChannelsPerNetPeer);
    CFG(nvlinkCentricSched);
#endif
#ifdef NCCL_API_MAGIC
    V(NCCL_API_MAGIC);
#endif
    V(NCCL_CONFIG_UNDEF_INT);
    V(NCCL_SPLIT_NOCOLOR);
#ifdef NCCL_SHRINK_ABORT
    V(NCCL_SHRINK_DEFAULT);
    V(NCCL_SHRINK_ABORT);
#endif

    V(ncclSuccess);
    V(ncclUnhandledCudaError);
    V(ncclSystemError);
    V(ncclInternalError);
    V(ncclInvalidArgument);
    V(ncclInvalidUsage);
    V(ncclRemoteError);
    V(ncclInProgress);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
    V(ncclTimeout);
#endif
    V(ncclNumResults);

    V(ncclInt8);
    V(ncclUint8);
    V(ncclInt32);
    V(ncclUint32);
    V(ncclInt64);
    V(ncclUint64);
    V(ncclFloat16);
    V(ncclFloat32);
    V(ncclFloat64);
    V(ncclBfloat16);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    V(ncclFloat8e4m3);
    V(ncclFloat8e5m2);
#endif
    V(ncclNumTypes);

    V(ncclSum);
    V(ncclProd);
    V(ncclMax);
    V(ncclMin);
    V(ncclAvg);
    V(ncclNumOps);

    V(ncclScalarDevice);
    V(ncclScalarHostImmediate);

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    SIZE(ncclWindow_t);
    V(NCCL_WIN_DEFAULT);
    V(NCCL_WIN_COLL_SYMMETRIC);
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
    SIZE(ncclWaitSignalDesc_t);
    OFF(ncclWaitSignalDesc_t, opCnt);
    OFF(ncclWaitSignalDesc_t, peer);
    OFF(ncclWaitSignalDesc_t, sigIdx);
    OFF(ncclWaitSignalDesc_t, ctx);
#endif
    return 0;
}
