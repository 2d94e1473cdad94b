/* nccl_raw: the baseline for tc-perf -B nccl. Plain NCCL calls at world
 * size 1, on the same kind of buffers (cuMemAlloc'd device memory, filled and
 * checked through host copies) and the same kind of stream (one non-blocking
 * stream of priority 0), measured the same way: host time spent issuing the
 * timed loop (-C) and device time from CUDA events recorded on the stream
 * around it. Only the cost of the library in between differs.
 *
 * No CUDA or NCCL headers are needed: libcuda and libnccl are opened with
 * dlopen and the few types and prototypes used are declared here. NCCL is
 * looked for at TORCHCOMM_NCCL_LIBRARY, then as libnccl.so.2 and libnccl.so.
 *
 * Build: cc -std=c11 -O2 nccl_raw.c -o nccl_raw -ldl
 * Usage: nccl_raw [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]
 *                 [-o all_reduce] [-d DTYPE] [-r sum|prod|min|max|avg]
 *                 [-a 0|1] [-z 0|1] [-C 0|1] [-G REPLAYS] [-D DEVICE]
 *                 [--csv FILE] [--label NAME]
 * Columns and CSV as tc-perf's (host_us and device_us always in the CSV).
 * -a is accepted for the same command lines and changes nothing: raw NCCL
 * calls always enqueue on the caller's stream. all_reduce is measured out of
 * place and in place (tc-perf's all_reduce is in place only). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the CUDA driver API used (types as in cuda.h) ---- */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef unsigned long long CUdeviceptr;
#define CU_STREAM_NON_BLOCKING 1u
#define CU_EVENT_DEFAULT 0u
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1

static struct {
  CUresult (*init)(unsigned);
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*device_count)(int *);
  CUresult (*primary_retain)(CUcontext *, CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*stream_create_prio)(CUstream *, unsigned, int);
  CUresult (*stream_sync)(CUstream);
  CUresult (*mem_alloc)(CUdeviceptr *, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  CUresult (*htod)(CUdeviceptr, const void *, size_t);
  CUresult (*dtoh)(void *, CUdeviceptr, size_t);
  CUresult (*event_create)(CUevent *, unsigned);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*event_sync)(CUevent);
  CUresult (*event_elapsed)(float *, CUevent, CUevent);
  CUresult (*begin_capture)(CUstream, int);
  CUresult (*end_capture)(CUstream, CUgraph *);
  CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*graph_launch)(CUgraphExec, CUstream);
  CUresult (*graph_exec_destroy)(CUgraphExec);
  CUresult (*graph_destroy)(CUgraph);
  CUresult (*error_name)(CUresult, const char **);
} cu;

/* ---- the NCCL API used (ints for enums, as nccl.h's values) ---- */
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
static struct {
  int (*get_version)(int *);
  int (*get_unique_id)(ncclUniqueId *);
  int (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
  int (*comm_destroy)(ncclComm_t);
  int (*all_reduce)(const void *, void *, size_t, int, int, ncclComm_t, CUstream);
  const char *(*error_string)(int);
} nccl;

static void die(const char *what) {
  fprintf(stderr, "nccl_raw: %s\n", what);
  exit(1);
}

static void cu_check(CUresult r, const char *call) {
  if (r == 0) return;
  const char *name = NULL;
  if (cu.error_name) cu.error_name(r, &name);
  fprintf(stderr, "nccl_raw: %s failed: %s (%d)\n", call, name ? name : "CUDA error", r);
  exit(1);
}

static void nccl_check(int r, const char *call) {
  if (r == 0) return;
  fprintf(stderr, "nccl_raw: %s failed: %s (%d)\n", call, nccl.error_string ? nccl.error_string(r) : "NCCL error", r);
  exit(1);
}

static void *sym(void *lib, const char *name, int required) {
  void *p = dlsym(lib, name);
  if (!p && required) {
    fprintf(stderr, "nccl_raw: symbol %s not found\n", name);
    exit(1);
  }
  return p;
}
/* Function pointers from dlsym without ISO C's object/function pointer cast. */
#define LOAD(lib, field, name) (*(void **)(&(field)) = sym((lib), (name), 1))

static void load(void) {
  void *c = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!c) c = dlopen("libcuda.so", RTLD_NOW | RTLD_GLOBAL);
  if (!c) die("libcuda.so.1 not found: no NVIDIA driver (TC_ERR_UNAVAILABLE)");
  LOAD(c, cu.init, "cuInit");
  LOAD(c, cu.device_get, "cuDeviceGet");
  LOAD(c, cu.device_count, "cuDeviceGetCount");
  LOAD(c, cu.primary_retain, "cuDevicePrimaryCtxRetain");
  LOAD(c, cu.ctx_set_current, "cuCtxSetCurrent");
  LOAD(c, cu.stream_create_prio, "cuStreamCreateWithPriority");
  LOAD(c, cu.stream_sync, "cuStreamSynchronize");
  LOAD(c, cu.mem_alloc, "cuMemAlloc_v2");
  LOAD(c, cu.mem_free, "cuMemFree_v2");
  LOAD(c, cu.htod, "cuMemcpyHtoD_v2");
  LOAD(c, cu.dtoh, "cuMemcpyDtoH_v2");
  LOAD(c, cu.event_create, "cuEventCreate");
  LOAD(c, cu.event_record, "cuEventRecord");
  LOAD(c, cu.event_sync, "cuEventSynchronize");
  *(void **)(&cu.event_elapsed) = sym(c, "cuEventElapsedTime_v2", 0);
  if (!cu.event_elapsed) LOAD(c, cu.event_elapsed, "cuEventElapsedTime");
  LOAD(c, cu.begin_capture, "cuStreamBeginCapture_v2");
  LOAD(c, cu.end_capture, "cuStreamEndCapture");
  LOAD(c, cu.graph_instantiate, "cuGraphInstantiateWithFlags");
  LOAD(c, cu.graph_launch, "cuGraphLaunch");
  LOAD(c, cu.graph_exec_destroy, "cuGraphExecDestroy");
  LOAD(c, cu.graph_destroy, "cuGraphDestroy");
  LOAD(c, cu.error_name, "cuGetErrorName");

  void *n = NULL;
  const char *explicit_path = getenv("TORCHCOMM_NCCL_LIBRARY");
  if (explicit_path && *explicit_path) n = dlopen(explicit_path, RTLD_NOW);
  if (!n) n = dlopen("libnccl.so.2", RTLD_NOW);
  if (!n) n = dlopen("libnccl.so", RTLD_NOW);
  if (!n) die("NCCL not found (TORCHCOMM_NCCL_LIBRARY, libnccl.so.2, libnccl.so) (TC_ERR_UNAVAILABLE)");
  LOAD(n, nccl.get_version, "ncclGetVersion");
  LOAD(n, nccl.get_unique_id, "ncclGetUniqueId");
  LOAD(n, nccl.comm_init_rank, "ncclCommInitRank");
  LOAD(n, nccl.comm_destroy, "ncclCommDestroy");
  LOAD(n, nccl.all_reduce, "ncclAllReduce");
  LOAD(n, nccl.error_string, "ncclGetErrorString");
}

/* ---- data types and reductions (nccl.h's values) ---- */
struct dtype { const char *name, *alias; int nccl; size_t size; };
static const struct dtype DTYPES[] = {
  {"int8", "int8", 0, 1},       {"uint8", "uint8", 1, 1},     {"int32", "int", 2, 4},
  {"uint32", "uint32", 3, 4},   {"int64", "int64", 4, 8},     {"uint64", "uint64", 5, 8},
  {"float16", "half", 6, 2},    {"float32", "float", 7, 4},   {"float64", "double", 8, 8},
  {"bfloat16", "bf16", 9, 2},
};
struct redop { const char *name; int nccl; };
static const struct redop REDOPS[] = {{"sum", 0}, {"prod", 1}, {"max", 2}, {"min", 3}, {"avg", 4}};

/* Writes the value v (1..5) as element i of a buffer of type t. */
static void put(const struct dtype *t, unsigned char *p, size_t i, int v) {
  static const uint16_t half[6] = {0, 0x3C00, 0x4000, 0x4200, 0x4400, 0x4500};
  static const uint16_t bf16[6] = {0, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0};
  switch (t->nccl) {
    case 0: ((int8_t *)p)[i] = (int8_t)v; break;
    case 1: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case 2: ((int32_t *)p)[i] = v; break;
    case 3: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case 4: ((int64_t *)p)[i] = v; break;
    case 5: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case 6: ((uint16_t *)p)[i] = half[v]; break;
    case 7: ((float *)p)[i] = (float)v; break;
    case 8: ((double *)p)[i] = v; break;
    case 9: ((uint16_t *)p)[i] = bf16[v]; break;
  }
}

/* Input element i for a run with seed (small non-zero, mixed). */
static int value(size_t i, unsigned seed) {
  uint64_t x = ((uint64_t)seed << 32) ^ (uint64_t)i;
  x *= 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return 1 + (int)(x % 5);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static size_t parse_size(const char *s) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    default: break;
  }
  return (size_t)v;
}

static void usage(void) {
  fprintf(stderr,
          "usage: nccl_raw [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1] [-o all_reduce]\n"
          "                [-d DTYPE] [-r sum|prod|min|max|avg] [-a 0|1] [-z 0|1] [-C 0|1] [-G REPLAYS]\n"
          "                [-D DEVICE] [--csv FILE] [--label NAME]\n");
  exit(2);
}

struct args {
  size_t min_bytes, max_bytes, factor;
  int iters, warmup, check, async_op, blocking, cpu_time, graphs, device;
  const struct dtype *dt;
  const struct redop *red;
  const char *csv, *label;
};

struct state {
  struct args a;
  ncclComm_t comm;
  CUstream s;
  CUevent ev0, ev1;
  unsigned seed;
};

struct figures { double host, device; long wrong; };

/* cuMemcpyHtoD from pageable memory may return before the device has the
 * data, and the benchmark's non-blocking stream does not wait for the legacy
 * stream the copy went to: wait for it before any collective reads it. */
static void upload(CUdeviceptr dst, const void *host, size_t bytes) {
  cu_check(cu.htod(dst, host, bytes), "cuMemcpyHtoD");
  cu_check(cu.stream_sync(NULL), "cuStreamSynchronize(legacy stream)");
}

/* Warm-up, the timed loop (or its graph replayed), then a checked run. */
static struct figures measure(struct state *st, CUdeviceptr in, CUdeviceptr out, size_t count, unsigned char *host,
                              unsigned char *back, size_t bytes) {
  const struct args *a = &st->a;
  const struct dtype *t = a->dt;
  int dt = t->nccl, op = a->red->nccl;
  const void *src = (const void *)(uintptr_t)in;
  void *dst = (void *)(uintptr_t)out;
  struct figures f = {0, 0, -1};
  st->seed++;
  for (size_t i = 0; i < count; i++) put(t, host, i, value(i, st->seed));
  upload(in, host, bytes);
  for (int i = 0; i < a->warmup; i++) nccl_check(nccl.all_reduce(src, dst, count, dt, op, st->comm, st->s), "ncclAllReduce");
  cu_check(cu.stream_sync(st->s), "cuStreamSynchronize");
  double t0, issued;
  long calls;
  if (a->graphs > 0) {
    CUgraph g;
    CUgraphExec ge;
    cu_check(cu.begin_capture(st->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
    for (int i = 0; i < a->iters; i++) nccl_check(nccl.all_reduce(src, dst, count, dt, op, st->comm, st->s), "ncclAllReduce");
    cu_check(cu.end_capture(st->s, &g), "cuStreamEndCapture");
    cu_check(cu.graph_instantiate(&ge, g, 0), "cuGraphInstantiateWithFlags");
    cu_check(cu.graph_launch(ge, st->s), "cuGraphLaunch"); /* untimed: uploads the graph */
    cu_check(cu.stream_sync(st->s), "cuStreamSynchronize");
    cu_check(cu.event_record(st->ev0, st->s), "cuEventRecord");
    t0 = now_us();
    for (int r = 0; r < a->graphs; r++) cu_check(cu.graph_launch(ge, st->s), "cuGraphLaunch");
    issued = now_us() - t0;
    cu_check(cu.event_record(st->ev1, st->s), "cuEventRecord");
    cu_check(cu.event_sync(st->ev1), "cuEventSynchronize");
    cu.graph_exec_destroy(ge);
    cu.graph_destroy(g);
    calls = (long)a->iters * a->graphs;
  } else {
    cu_check(cu.event_record(st->ev0, st->s), "cuEventRecord");
    t0 = now_us();
    for (int i = 0; i < a->iters; i++) {
      nccl_check(nccl.all_reduce(src, dst, count, dt, op, st->comm, st->s), "ncclAllReduce");
      if (a->blocking) cu_check(cu.stream_sync(st->s), "cuStreamSynchronize");
    }
    issued = now_us() - t0;
    cu_check(cu.event_record(st->ev1, st->s), "cuEventRecord");
    cu_check(cu.event_sync(st->ev1), "cuEventSynchronize");
    calls = a->iters;
  }
  float ms = 0;
  cu_check(cu.event_elapsed(&ms, st->ev0, st->ev1), "cuEventElapsedTime");
  f.host = issued / calls;
  f.device = ms * 1e3 / calls;
  if (a->check) {
    /* Fresh data; out of place the output first holds a sentinel (0x7f bytes). One
     * rank: every reduction returns the input. */
    st->seed++;
    if (out != in) {
      memset(host, 0x7f, bytes);
      upload(out, host, bytes);
    }
    for (size_t i = 0; i < count; i++) put(t, host, i, value(i, st->seed));
    upload(in, host, bytes);
    nccl_check(nccl.all_reduce(src, dst, count, dt, op, st->comm, st->s), "ncclAllReduce");
    cu_check(cu.stream_sync(st->s), "cuStreamSynchronize");
    cu_check(cu.dtoh(back, out, bytes), "cuMemcpyDtoH");
    f.wrong = 0;
    for (size_t i = 0; i < count; i++)
      if (memcmp(back + i * t->size, host + i * t->size, t->size) != 0) f.wrong++;
  }
  return f;
}

int main(int argc, char **argv) {
  struct state st;
  memset(&st, 0, sizeof st);
  struct args *a = &st.a;
  a->min_bytes = a->max_bytes = 32u << 20;
  a->factor = 2;
  a->iters = 20;
  a->warmup = 5;
  a->check = 1;
  a->dt = &DTYPES[7];
  a->red = &REDOPS[0];
  a->label = "nccl-raw";
  for (int i = 1; i < argc; i += 2) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(f, "-h") || !strcmp(f, "--help") || !v) usage();
    if (!strcmp(f, "-b")) a->min_bytes = parse_size(v);
    else if (!strcmp(f, "-e")) a->max_bytes = parse_size(v);
    else if (!strcmp(f, "-f")) a->factor = (size_t)atol(v);
    else if (!strcmp(f, "-n")) a->iters = atoi(v);
    else if (!strcmp(f, "-w")) a->warmup = atoi(v);
    else if (!strcmp(f, "-c")) a->check = atoi(v);
    else if (!strcmp(f, "-a")) a->async_op = atoi(v);
    else if (!strcmp(f, "-z")) a->blocking = atoi(v);
    else if (!strcmp(f, "-C")) a->cpu_time = atoi(v);
    else if (!strcmp(f, "-G")) a->graphs = atoi(v);
    else if (!strcmp(f, "-D")) a->device = atoi(v);
    else if (!strcmp(f, "--csv")) a->csv = v;
    else if (!strcmp(f, "--label")) a->label = v;
    else if (!strcmp(f, "-o")) {
      if (strcmp(v, "all_reduce") && strcmp(v, "allreduce")) { fprintf(stderr, "nccl_raw: only all_reduce\n"); exit(2); }
    } else if (!strcmp(f, "-d")) {
      a->dt = NULL;
      for (size_t k = 0; k < sizeof DTYPES / sizeof DTYPES[0]; k++)
        if (!strcmp(v, DTYPES[k].name) || !strcmp(v, DTYPES[k].alias)) a->dt = &DTYPES[k];
      if (!a->dt) { fprintf(stderr, "nccl_raw: unknown dtype %s\n", v); exit(2); }
    } else if (!strcmp(f, "-r")) {
      a->red = NULL;
      for (size_t k = 0; k < sizeof REDOPS / sizeof REDOPS[0]; k++)
        if (!strcmp(v, REDOPS[k].name)) a->red = &REDOPS[k];
      if (!a->red) { fprintf(stderr, "nccl_raw: unknown reduce op %s\n", v); exit(2); }
    } else usage();
  }
  if (a->factor < 2 || a->iters < 1 || a->min_bytes > a->max_bytes) die("need -f >= 2, -n >= 1 and -b <= -e");

  load();
  CUresult r = cu.init(0);
  if (r != 0) cu_check(r, "cuInit (no usable GPU: TC_ERR_UNAVAILABLE)");
  int ndev = 0;
  cu_check(cu.device_count(&ndev), "cuDeviceGetCount");
  if (ndev < 1 || a->device >= ndev) die("no such CUDA device (TC_ERR_UNAVAILABLE)");
  CUdevice dev;
  CUcontext ctx;
  cu_check(cu.device_get(&dev, a->device), "cuDeviceGet");
  cu_check(cu.primary_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  cu_check(cu.ctx_set_current(ctx), "cuCtxSetCurrent");
  cu_check(cu.stream_create_prio(&st.s, CU_STREAM_NON_BLOCKING, 0), "cuStreamCreateWithPriority");
  cu_check(cu.event_create(&st.ev0, CU_EVENT_DEFAULT), "cuEventCreate");
  cu_check(cu.event_create(&st.ev1, CU_EVENT_DEFAULT), "cuEventCreate");
  int version = 0;
  nccl_check(nccl.get_version(&version), "ncclGetVersion");
  ncclUniqueId id;
  nccl_check(nccl.get_unique_id(&id), "ncclGetUniqueId");
  nccl_check(nccl.comm_init_rank(&st.comm, 1, id, 0), "ncclCommInitRank");

  FILE *csv = NULL;
  if (a->csv) {
    FILE *probe = fopen(a->csv, "r");
    int fresh = 1;
    if (probe) { fresh = fgetc(probe) == EOF; fclose(probe); }
    csv = fopen(a->csv, "a");
    if (!csv) die("cannot open the CSV file");
    if (fresh)
      fprintf(csv, "system,op,nranks,size,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong,host_us,device_us\n");
  }
  printf("# nccl_raw: all_reduce, raw NCCL %d (%s), 1 rank, CUDA device %d, iters %d, warm-up %d, check %d%s%s, time = %s\n",
         version, a->label, a->device, a->iters, a->warmup, a->check, a->blocking ? ", stream synchronized after each call" : "",
         a->graphs > 0 ? ", CUDA graph of the loop replayed" : "",
         a->cpu_time ? "host time issuing per call (-C)" : "device time per call (CUDA events)");
  if (a->graphs > 0) printf("# graph replays: %d\n", a->graphs);
  if (a->async_op) printf("# -a 1 changes nothing here: raw NCCL calls always enqueue on the caller's stream\n");
  printf("#\n");
  printf("# %10s %12s %9s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "", "", "", "", "", "out-of-place", "", "", "", "in-place",
         "", "", "");
  printf("# %10s %12s %9s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "size", "count", "type", "redop", "root", "time", "algbw",
         "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("# %10s %12s %9s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)",
         "", "(us)", "(GB/s)", "(GB/s)", "");
  fflush(stdout);

  size_t es = a->dt->size, maxb = a->max_bytes / es * es;
  if (maxb == 0) maxb = es;
  CUdeviceptr in, out;
  cu_check(cu.mem_alloc(&in, maxb), "cuMemAlloc");
  cu_check(cu.mem_alloc(&out, maxb), "cuMemAlloc");
  unsigned char *host = malloc(maxb), *back = malloc(maxb);
  if (!host || !back) die("out of host memory");
  long wrong_total = 0;
  double busbw_sum = 0;
  int busbw_n = 0;
  size_t last = 0;
  for (size_t size = a->min_bytes;; size = size * a->factor > a->max_bytes ? a->max_bytes : size * a->factor) {
    size_t count = size / es, bytes = count * es;
    if (count > 0 && bytes != last) {
      last = bytes;
      printf("  %10zu %12zu %9s %6s %5s", bytes, count, a->dt->name, a->red->name, "-1");
      for (int in_place = 0; in_place <= 1; in_place++) {
        struct figures f = measure(&st, in, in_place ? in : out, count, host, back, bytes);
        double t = a->cpu_time ? f.host : f.device;
        double algbw = bytes / (t * 1e-6) / 1e9, busbw = 0.0; /* one rank: factor 2(n-1)/n = 0 */
        busbw_sum += busbw;
        busbw_n++;
        if (f.wrong > 0) wrong_total += f.wrong;
        if (f.wrong < 0) printf("   %9.2f %7.3f %7.3f %6s", t, algbw, busbw, "N/A");
        else printf("   %9.2f %7.3f %7.3f %6ld", t, algbw, busbw, f.wrong);
        if (csv)
          fprintf(csv, "%s,all_reduce,1,%zu,%zu,%s,%s,-1,%s,%.3f,%.6f,%.6f,%ld,%.3f,%.3f\n", a->label, bytes, count, a->dt->name,
                  a->red->name, in_place ? "in-place" : "out-of-place", t, algbw, busbw, f.wrong, f.host, f.device);
      }
      printf("\n");
      fflush(stdout);
    }
    if (size >= a->max_bytes) break;
  }
  printf("# Out of bounds values : %ld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %.6f \n#\n", busbw_n ? busbw_sum / busbw_n : 0.0);
  if (csv) fclose(csv);
  nccl.comm_destroy(st.comm);
  cu.mem_free(in);
  cu.mem_free(out);
  free(host);
  free(back);
  return wrong_total ? 1 : 0;
}
