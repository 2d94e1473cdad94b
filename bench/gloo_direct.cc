// gloo_direct: the all-reduce that torchcomm's gloo backend performs, called
// on Gloo directly, printed in tc-perf's columns, as the baseline for our
// overhead.
//
// Same Gloo calls as the backend (gloo_shim/tc_gloo.cc): a TCP device with
// default attributes, a rendezvous::Context connected as a full mesh, and
// one gloo::allreduce per operation (AllreduceOptions, in place, algorithm
// left unspecified, i.e. ring; a new tag per call). The reduction is Gloo's
// own gloo::sum<float> (a direct user's choice; the backend calls its own
// kernel through the same function-object slot; build with -O3 so that the
// template loop is vectorized like our kernel). Calls block, as tc-perf's
// default mode does; time = mean over ranks of elapsed / iterations.
//
// Rank and size come from RANK and WORLD_SIZE (tc-run sets them); the
// rendezvous is a gloo FileStore in the directory given by --store (empty,
// one per run).
//
//   tc-run -n 2 -- gloo_direct --store DIR [-b 4] [-e 64M] [-f 2] [-n 20] [-w 5] [-c 1]
//                                         [--csv FILE] [--label NAME]

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <sys/stat.h>

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

size_t parse_size(const char *s) {
  char *end = nullptr;
  unsigned long long v = strtoull(s, &end, 10);
  switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

int env_int(const char *name) {
  const char *v = getenv(name);
  if (v == nullptr) {
    fprintf(stderr, "gloo_direct: %s is not set (run under tc-run)\n", name);
    exit(2);
  }
  return atoi(v);
}

// Element i of rank r's input for a check run with seed: small non-zero
// integers (exact sums), mixed so that no rank's pattern lines up with another's.
float value(int r, size_t i, uint64_t seed) {
  uint64_t x = (static_cast<uint64_t>(r) << 48) ^ (seed << 32) ^ static_cast<uint64_t>(i);
  x *= 0x9e3779b97f4a7c15ULL;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 32;
  return static_cast<float>(1 + x % 5);
}

struct Runner {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  uint32_t tag = 1;

  void allreduce(float *buf, size_t count) {
    gloo::AllreduceOptions opts(ctx);
    opts.setOutput<float>(buf, count);
    opts.setReduceFunction(
        static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
    opts.setTag(tag++);
    gloo::allreduce(opts);
  }

  void barrier() {
    gloo::BarrierOptions opts(ctx);
    opts.setTag(tag++);
    gloo::barrier(opts);
  }

  double sum_over_ranks(double v) {
    gloo::AllreduceOptions opts(ctx);
    opts.setOutput<double>(&v, 1);
    opts.setReduceFunction(
        static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<double>));
    opts.setTag(tag++);
    gloo::allreduce(opts);
    return v;
  }
};

}  // namespace

int main(int argc, char **argv) {
  size_t minb = 4, maxb = 64 << 20, factor = 2;
  int iters = 20, warmup = 5, check = 1;
  std::string store_dir, csv_path, label = "gloo-direct";
  for (int i = 1; i < argc; i++) {
    std::string f = argv[i];
    if (i + 1 >= argc) {
      fprintf(stderr, "gloo_direct: %s needs a value\n", f.c_str());
      return 2;
    }
    const char *v = argv[++i];
    if (f == "-b") minb = parse_size(v);
    else if (f == "-e") maxb = parse_size(v);
    else if (f == "-f") factor = parse_size(v);
    else if (f == "-n") iters = atoi(v);
    else if (f == "-w") warmup = atoi(v);
    else if (f == "-c") check = atoi(v);
    else if (f == "-o") {
      if (strcmp(v, "all_reduce") != 0) {
        fprintf(stderr, "gloo_direct: only all_reduce\n");
        return 2;
      }
    } else if (f == "--store") store_dir = v;
    else if (f == "--csv") csv_path = v;
    else if (f == "--label") label = v;
    else {
      fprintf(stderr, "gloo_direct: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  if (store_dir.empty() || factor < 2 || iters < 1 || minb > maxb) {
    fprintf(stderr, "usage: gloo_direct --store DIR [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1] [--csv FILE] [--label NAME]\n");
    return 2;
  }
  const int rank = env_int("RANK"), size = env_int("WORLD_SIZE");

  gloo::transport::tcp::attr attr;
  if (const char *h = getenv("TORCHCOMM_GLOO_HOSTNAME")) attr.hostname = h;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(std::chrono::seconds(600));
  {
    gloo::rendezvous::FileStore store(store_dir);
    ctx->connectFullMesh(store, device);
  }
  Runner run{ctx};

  FILE *csv = nullptr;
  if (rank == 0 && !csv_path.empty()) {
    struct stat st;
    bool fresh = stat(csv_path.c_str(), &st) != 0 || st.st_size == 0;
    csv = fopen(csv_path.c_str(), "a");
    if (csv == nullptr) {
      perror(csv_path.c_str());
      return 2;
    }
    if (fresh)
      fprintf(csv, "system,op,nranks,size,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong\n");
  }
  if (rank == 0) {
    printf("# gloo_direct: all_reduce (gloo::allreduce, ring, TCP) %d ranks, iters %d, warm-up %d, check %d\n#\n",
           size, iters, warmup, check);
    printf("# %10s %12s %9s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "", "", "", "", "", "out-of-place", "",
           "", "", "in-place", "", "", "");
    printf("# %10s %12s %9s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
           "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("# %10s %12s %9s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
           "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  const double factor_bus = 2.0 * (size - 1) / size;
  double bus_sum = 0;
  int bus_n = 0;
  uint64_t wrong_total = 0, seed = 0;
  size_t last = 0;
  for (size_t s = minb;; s = std::min(s * factor, maxb)) {
    size_t count = s / sizeof(float);
    size_t bytes = count * sizeof(float);
    if (count > 0 && bytes != last) {
      last = bytes;
      std::vector<float> buf(count);
      seed++;
      for (size_t i = 0; i < count; i++) buf[i] = value(rank, i, seed);
      for (int i = 0; i < warmup; i++) run.allreduce(buf.data(), count);
      run.barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; i++) run.allreduce(buf.data(), count);
      auto t1 = std::chrono::steady_clock::now();
      double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
      us = run.sum_over_ranks(us) / size;
      long long wrong = -1;
      if (check) {
        seed++;
        for (size_t i = 0; i < count; i++) buf[i] = value(rank, i, seed);
        run.allreduce(buf.data(), count);
        double w = 0;
        for (size_t i = 0; i < count; i++) {
          float want = 0;
          for (int r = 0; r < size; r++) want += value(r, i, seed);
          if (buf[i] != want) w++;
        }
        wrong = static_cast<long long>(run.sum_over_ranks(w));
        wrong_total += static_cast<uint64_t>(wrong);
      }
      double algbw = bytes / (us * 1e-6) / 1e9, busbw = algbw * factor_bus;
      bus_sum += busbw;
      bus_n++;
      if (rank == 0) {
        char w[32];
        if (wrong >= 0) snprintf(w, sizeof w, "%lld", wrong);
        else snprintf(w, sizeof w, "N/A");
        printf("  %10zu %12zu %9s %6s %5s   %9s %7s %7s %6s   %9.2f %7.3f %7.3f %6s\n", bytes, count, "float32", "sum",
               "-1", "N/A", "N/A", "N/A", "N/A", us, algbw, busbw, w);
        if (csv)
          fprintf(csv, "%s,all_reduce,%d,%zu,%zu,float32,sum,-1,in-place,%.3f,%.6f,%.6f,%lld\n", label.c_str(), size,
                  bytes, count, us, algbw, busbw, wrong);
      }
    }
    if (s >= maxb) break;
  }
  if (rank == 0) {
    printf("# Out of bounds values : %" PRIu64 " %s\n", wrong_total, wrong_total == 0 ? "OK" : "FAILED");
    if (bus_n > 0) printf("# Avg bus bandwidth    : %.6f \n#\n", bus_sum / bus_n);
    fflush(stdout);
  }
  if (csv) fclose(csv);
  run.barrier();
  return wrong_total == 0 ? 0 : 1;
}
