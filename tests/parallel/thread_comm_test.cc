// The thread backend against values each rank's inputs determine (Note [Communicator
// contract]). Catch2 assertions are not thread-safe, so ranks record what they see and the
// test checks it after run_thread_ranks returns.
#include "parallel/comm/thread_comm.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "core/factories.h"
#include "core/parallel.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

using namespace std::chrono_literals;

// Rank r's input element i: distinct per rank and element, exact in every dtype used.
double value(int r, int64_t i) { return static_cast<double>((r + 1) * 1000 + (i * 7) % 113) / 8; }

Tensor rank_input(int r, int64_t n, DType dtype) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(r, i);
  return from_vector(v, {n}).to(dtype);
}

// op over ranks 0..size-1 in rank order, in dtype T (the order the backend promises).
template <class T>
std::vector<double> expected_reduce(int size, int64_t n, ReduceOp op) {
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) {
    T acc = static_cast<T>(value(0, i));
    for (int r = 1; r < size; ++r) {
      const T x = static_cast<T>(value(r, i));
      acc = op == ReduceOp::sum   ? acc + x
            : op == ReduceOp::max ? std::max(acc, x)
                                  : std::min(acc, x);
    }
    out[i] = static_cast<double>(acc);
  }
  return out;
}

// The message of the tessera::Error f throws, or "no error" (safe on any thread).
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Note [16-bit reductions]: op over the ranks' 16-bit inputs (rank_input, rounded to
// `dtype`), in f32 in rank order, rounded once to `dtype`.
Tensor expected_half_reduce(int size, int64_t n, ReduceOp op, DType dtype) {
  std::vector<float> acc = rank_input(0, n, dtype).to_vector<float>();
  for (int r = 1; r < size; ++r) {
    const std::vector<float> x = rank_input(r, n, dtype).to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      acc[i] = op == ReduceOp::sum   ? acc[i] + x[i]
               : op == ReduceOp::max ? std::max(acc[i], x[i])
                                     : std::min(acc[i], x[i]);
    }
  }
  return from_vector(acc, {n}).to(dtype);
}

std::vector<char> raw_bytes(const Tensor& t) {
  std::vector<char> b(t.nbytes());
  std::memcpy(b.data(), t.raw_data(), b.size());
  return b;
}

}  // namespace

TEST_CASE("thread all_reduce: exact rank-order results, identical on every rank", "[comm]") {
  for (int size : {1, 2, 3, 4}) {
    for (int64_t n : {int64_t{7}, int64_t{1001}}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
        for (DType dtype : {DType::f32, DType::f64, DType::i64}) {
          std::vector<Tensor> results(size);
          run_thread_ranks(size, [&](Communicator& comm) {
            Tensor t = rank_input(comm.rank(), n, dtype);
            comm.all_reduce(t, op);
            results[comm.rank()] = t;
          });
          std::vector<double> want = dtype == DType::f32   ? expected_reduce<float>(size, n, op)
                                     : dtype == DType::f64 ? expected_reduce<double>(size, n, op)
                                                           : expected_reduce<int64_t>(size, n, op);
          INFO("size " << size << " n " << n << " op " << reduce_op_name(op) << " dtype "
                       << dtype_name(dtype));
          REQUIRE(results[0].to_vector<double>() == want);
          for (int r = 1; r < size; ++r) REQUIRE(raw_bytes(results[r]) == raw_bytes(results[0]));
        }
      }
    }
  }
}

TEST_CASE("thread f16 and bf16 reductions: f32 sums in rank order rounded once, on every rank",
          "[comm]") {
  for (int size : {1, 2, 3, 4}) {
    for (int64_t n : {int64_t{7}, int64_t{1001}}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
        for (DType dtype : {DType::f16, DType::bf16}) {
          INFO("size " << size << " n " << n << " op " << reduce_op_name(op) << " dtype "
                       << dtype_name(dtype));
          const Tensor want = expected_half_reduce(size, n, op, dtype);
          // n * size values, so that reduce_scatter's blocks are n each.
          const Tensor want_blocks = expected_half_reduce(size, n * size, op, dtype);
          std::vector<Tensor> reduced(size), scattered(size);
          run_thread_ranks(size, [&](Communicator& comm) {
            Tensor t = rank_input(comm.rank(), n, dtype);
            comm.all_reduce(t, op);
            reduced[comm.rank()] = t;
            const Tensor out = empty({n}, {dtype});
            comm.reduce_scatter(rank_input(comm.rank(), n * size, dtype), out, op);
            scattered[comm.rank()] = out;
          });
          for (int r = 0; r < size; ++r) {
            REQUIRE(raw_bytes(reduced[r]) == raw_bytes(want));
            REQUIRE(raw_bytes(scattered[r]) == raw_bytes(want_blocks.narrow(0, r * n, n)));
          }
        }
      }
    }
  }
}

TEST_CASE("thread reduce_scatter, all_gather, all_to_all, broadcast, send/recv", "[comm]") {
  for (int size : {1, 2, 3}) {
    const int64_t n = 5;  // elements per block
    std::vector<std::vector<double>> scattered(size), gathered(size), exchanged(size),
        broadcasted(size), received(size);
    run_thread_ranks(size, [&](Communicator& comm) {
      const int r = comm.rank();
      const Tensor in = rank_input(r, n * size, DType::f64);
      Tensor out = zeros({n}, {DType::f64});
      comm.reduce_scatter(in, out);
      scattered[r] = out.to_vector<double>();

      Tensor all = zeros({n * size}, {DType::f64});
      comm.all_gather(rank_input(r, n, DType::f64), all);
      gathered[r] = all.to_vector<double>();

      Tensor swapped = zeros({n * size}, {DType::f64});
      comm.all_to_all(in, swapped);
      exchanged[r] = swapped.to_vector<double>();

      Tensor b = rank_input(r, n, DType::f64);
      comm.broadcast(b, size - 1);
      broadcasted[r] = b.to_vector<double>();

      if (size > 1) {  // a ring: even ranks send first, so the pairs never deadlock
        Tensor got = zeros({n}, {DType::f64});
        const int next = (r + 1) % size, prev = (r + size - 1) % size;
        if (r % 2 == 0) {
          comm.send(rank_input(r, n, DType::f64), next);
          comm.recv(got, prev);
        } else {
          comm.recv(got, prev);
          comm.send(rank_input(r, n, DType::f64), next);
        }
        received[r] = got.to_vector<double>();
      }
    });
    for (int r = 0; r < size; ++r) {
      INFO("size " << size << " rank " << r);
      for (int64_t i = 0; i < n; ++i) {
        double sum = 0;
        for (int q = 0; q < size; ++q) sum += value(q, r * n + i);
        REQUIRE(scattered[r][i] == sum);
        REQUIRE(broadcasted[r][i] == value(size - 1, i));
        if (size > 1) REQUIRE(received[r][i] == value((r + size - 1) % size, i));
        for (int q = 0; q < size; ++q) {
          REQUIRE(gathered[r][q * n + i] == value(q, i));
          REQUIRE(exchanged[r][q * n + i] == value(q, r * n + i));  // block r of rank q's in
        }
      }
    }
  }
}

TEST_CASE("thread split: groups by color, ranks ordered by key", "[comm]") {
  const int size = 5;
  std::vector<std::string> names(size);
  std::vector<int> new_ranks(size, -2), new_sizes(size, -2);
  std::vector<double> sums(size, -1);
  run_thread_ranks(size, [&](Communicator& comm) {
    const int r = comm.rank();
    const int color = r == 4 ? -1 : r % 2;  // {0, 2} and {1, 3}; rank 4 joins none
    std::unique_ptr<Communicator> child = comm.split(color, -r);  // reversed order
    if (child) {
      names[r] = child->name();
      new_ranks[r] = child->rank();
      new_sizes[r] = child->size();
      Tensor t = full({1}, r, {DType::f64});
      child->all_reduce(t);
      sums[r] = t.item<double>();
    }
    comm.barrier();  // the parent still works after a split
  });
  REQUIRE(names == std::vector<std::string>{"world:0", "world:1", "world:0", "world:1", ""});
  REQUIRE(new_ranks == std::vector<int>{1, 1, 0, 0, -2});
  REQUIRE(new_sizes == std::vector<int>{2, 2, 2, 2, -2});
  REQUIRE(sums == std::vector<double>{2, 4, 2, 4, -1});
}

TEST_CASE("thread ranks start with their caller's OpenMP thread count", "[comm]") {
  // A new thread starts from OpenMP's process default, not from what its creator set: a
  // bench that sets one thread per rank would otherwise run every rank on all cores.
  for (const int threads : {1, 3}) {
    const testing::ScopedThreads scoped(threads);
    std::vector<int> seen(3, 0);
    run_thread_ranks(3, [&](Communicator& comm) { seen[comm.rank()] = num_threads(); });
    REQUIRE(seen == std::vector<int>(3, threads));
  }
}

TEST_CASE("thread stats count calls and ring bytes per rank", "[comm]") {
  std::vector<CommStats> stats(4);
  run_thread_ranks(4, [&](Communicator& comm) {
    Tensor t = zeros({1000}, {DType::f32});  // 4000 bytes
    comm.all_reduce(t);
    comm.all_reduce(t);
    Tensor block = zeros({250}, {DType::f32});
    comm.reduce_scatter(t, block);
    comm.all_gather(block, t);
    comm.broadcast(t, 2);
    comm.barrier();
    stats[comm.rank()] = comm.stats();
    REQUIRE(comm.sequence() == 6);
  });
  const CommStats& s = stats[2];
  REQUIRE(s[CommOp::all_reduce].calls == 2);
  REQUIRE(s[CommOp::all_reduce].bytes_sent == 2 * 6000);  // 2 x 3/4 x 4000 each
  REQUIRE(s[CommOp::reduce_scatter].bytes_sent == 3000);
  REQUIRE(s[CommOp::all_gather].bytes_sent == 3000);
  REQUIRE(s[CommOp::broadcast].bytes_sent == 4000);  // the root
  REQUIRE(stats[0][CommOp::broadcast].bytes_sent == 0);
  REQUIRE(s[CommOp::barrier].calls == 1);
  REQUIRE(s.total_bytes_sent() == 12000 + 3000 + 3000 + 4000);
  REQUIRE(s.summary().find("all_reduce: 2 calls, 0.01 MB sent") != std::string::npos);
}

TEST_CASE("thread: a peer that never arrives fails the waiting rank within the timeout",
          "[comm][reliability]") {
  std::string error, later;
  const auto start = std::chrono::steady_clock::now();
  run_thread_ranks(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 1) return;  // exits mid-step
        Tensor t = zeros({3});
        error = message_of([&] { comm.all_reduce(t); });
        later = message_of([&] { comm.barrier(); });
      },
      CommOptions{200ms});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(error ==
          "[comm world, rank 0 of 2] all_reduce #0: timed out after 200 ms waiting for rank(s) 1 "
          "(exited, or called a different operation)");
  REQUIRE(later.rfind("[comm world, rank 0 of 2] barrier #1: the group is unusable after an "
                      "earlier failure: ",
                      0) == 0);
  REQUIRE(seconds < 5);
}

TEST_CASE("thread: a receive whose sender never sends times out, naming the sender",
          "[comm][reliability]") {
  std::string error;
  run_thread_ranks(
      3,
      [&](Communicator& comm) {
        if (comm.rank() != 1) return;
        Tensor t = zeros({3});
        error = message_of([&] { comm.recv(t, 2); });
      },
      CommOptions{100ms});
  REQUIRE(error ==
          "[comm world, rank 1 of 3] recv #0: timed out after 100 ms waiting for rank 2 "
          "(exited, or called a different operation)");
}

TEST_CASE("thread: ranks that call different operations all fail, naming both",
          "[comm][reliability]") {
  std::vector<std::string> errors(2);
  run_thread_ranks(2, [&](Communicator& comm) {
    Tensor t = zeros({comm.rank() == 0 ? 10 : 11});
    errors[comm.rank()] = message_of([&] { comm.all_reduce(t); });
  });
  REQUIRE(errors[0] ==
          "[comm world, rank 0 of 2] all_reduce #0: ranks disagree: rank 1 called all_reduce #0 "
          "of 11 f32, this rank all_reduce #0 of 10 f32");
  REQUIRE(errors[1].find("rank 0 called all_reduce #0 of 10 f32") != std::string::npos);
}

TEST_CASE("thread: a rank's failed call makes its waiting peers fail at once",
          "[comm][reliability]") {
  std::vector<std::string> errors(3);
  const auto start = std::chrono::steady_clock::now();
  run_thread_ranks(
      3,
      [&](Communicator& comm) {
        Tensor t = zeros({4, 4});
        // Rank 2 passes a non-contiguous view: it fails before joining the collective.
        errors[comm.rank()] =
            message_of([&] { comm.all_reduce(comm.rank() == 2 ? t.transpose(0, 1) : t); });
      },
      CommOptions{std::chrono::minutes(1)});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(errors[2] == "[comm world, rank 2 of 3] all_reduce #0: t must be contiguous");
  REQUIRE(errors[0] ==
          "[comm world, rank 0 of 3] all_reduce #0: another rank failed: rank 2: " + errors[2]);
  REQUIRE(seconds < 30);  // far below the one-minute timeout
}

TEST_CASE("thread: bad arguments name the op and what was expected", "[comm]") {
  std::vector<std::string> errors;
  run_thread_ranks(1, [&](Communicator& comm) {
    errors.push_back(message_of([&] { comm.all_reduce(zeros({3}, {DType::boolean})); }));
  });
  run_thread_ranks(1, [&](Communicator& comm) {
    errors.push_back(message_of([&] { comm.all_gather(zeros({3}), zeros({4})); }));
  });
  run_thread_ranks(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 0) {
          errors.push_back(message_of([&] { comm.send(zeros({3}), 2); }));
        }
      },
      CommOptions{100ms});
  run_thread_ranks(1, [&](Communicator& comm) {
    const Tensor buffer = zeros({6});
    errors.push_back(
        message_of([&] { comm.all_gather(buffer.narrow(0, 1, 3), buffer.narrow(0, 3, 3)); }));
  });
  REQUIRE(errors[0] ==
          "[comm world, rank 0 of 1] all_reduce #0: reductions support f32, f64, i32, i64, u8, "
          "f16 and bf16, found bool");
  REQUIRE(errors[1] ==
          "[comm world, rank 0 of 1] all_gather #0: expected out to hold 3 elements for 3 in 1 "
          "ranks, found 4");
  REQUIRE(errors[2] == "[comm world, rank 0 of 2] send #0: expected dst in [0, 2), found 2");
  REQUIRE(errors[3] ==
          "[comm world, rank 0 of 1] all_gather #0: expected in and out in separate memory, "
          "found them overlapping");
}

}  // namespace tessera::parallel
