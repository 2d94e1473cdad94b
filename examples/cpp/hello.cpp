// libtorchcomm from C++: every rank of a job joins a host ("gloo")
// communicator, all-reduces a vector, passes a token around a ring with an
// asynchronous send/receive batch, and checks both results.
//
//   c++ -std=c++17 hello.cpp $(pkg-config --cflags --libs torchcomm) -o hello
//   tc-run -n 3 -- ./hello        (or: torchrun --nproc-per-node 3 --no-python ./hello)
#include <torchcomm.hpp>

#include <cstdio>
#include <vector>

int main() {
    try {
        tc::Comm comm("gloo");  // rank, size and store from the launcher's environment
        const int rank = comm.rank(), size = comm.size();

        std::vector<float> grad(4, float(rank + 1));
        comm.all_reduce(grad, tc::Avg);
        const float mean = (size + 1) / 2.0f;

        std::vector<int> token{rank}, received{-1};
        tc::Work work = comm.batch()
                            .send(token, (rank + 1) % size)
                            .recv(received, (rank + size - 1) % size)
                            .issue(tc::OpOptions().async());
        work.wait();

        const bool ok = grad[0] == mean && received[0] == (rank + size - 1) % size;
        std::printf("rank %d/%d: mean %.2f, token from %d: %s\n", rank, size, grad[0], received[0],
                    ok ? "ok" : "WRONG");
        comm.finalize();
        return ok ? 0 : 1;
    } catch (const tc::Error &e) {  // code() and the library's detail in what()
        std::fprintf(stderr, "torchcomm error %d: %s\n", e.code(), e.what());
        return 1;
    }
}
