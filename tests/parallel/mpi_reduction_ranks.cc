// The MPI backend's reductions across real processes (part of the mpi_comm_ranks program;
// see tests/parallel/mpi_comm_ranks.cc): all_reduce and reduce_scatter in every dtype,
// identical bits on every rank, and the 16-bit reductions of Note [16-bit reductions].
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/factories.h"
#include "parallel/comm/mpi_comm.h"
#include "tests/parallel/mpi_ranks.h"

using tessera::DType;
using tessera::Tensor;
using tessera::parallel::Communicator;
using tessera::parallel::ReduceOp;
using tessera::parallel::testing::first_mismatch;
using tessera::parallel::testing::new_world;

namespace {

// Rank r's element i in the exact tests: an integer in [-1000, 1000], so that every
// dtype holds it and sums of a few of them exactly, whatever order MPI adds them in.
int64_t exact_value(int r, int64_t i) { return (i * 7919 + r * 104729 + 13) % 2001 - 1000; }

// Rank r's element i in the rounding tests: sums of these round differently in different
// orders, which is what makes identical results across ranks a property worth testing.
double rounding_value(int r, int64_t i) {
  return std::sin(0.37 * static_cast<double>(i) + 1.3 * r) * 1000.0 / (1 + i % 17);
}

template <class T>
T exact_as(int r, int64_t i) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(exact_value(r, i)) * T(0.5);  // halves: still exact
  } else {
    return static_cast<T>(exact_value(r, i));
  }
}

template <class T>
T combine(T a, T b, ReduceOp op) {
  return op == ReduceOp::sum ? a + b : op == ReduceOp::max ? std::max(a, b) : std::min(a, b);
}

// all_reduce of exact values equals the reduction computed locally, element for element.
template <class T>
void check_exact_all_reduce(Communicator& comm, int64_t n, ReduceOp op) {
  std::vector<T> mine(n);
  std::vector<T> want(n);
  for (int64_t i = 0; i < n; ++i) {
    mine[i] = exact_as<T>(comm.rank(), i);
    want[i] = exact_as<T>(0, i);
    for (int r = 1; r < comm.size(); ++r) want[i] = combine(want[i], exact_as<T>(r, i), op);
  }
  const Tensor t = tessera::from_vector(mine);  // (n)
  comm.all_reduce(t, op);
  const std::vector<T> got = t.to_vector<T>();
  const int64_t bad = first_mismatch(got, want);
  INFO("dtype " << tessera::dtype_name(t.dtype()) << ", n " << n << ", op "
                << tessera::parallel::reduce_op_name(op) << ", first mismatch at " << bad);
  CHECK(bad == -1);
}

// The bytes of every rank's copy of t (size * nbytes), gathered to every rank.
std::vector<char> gather_bytes(Communicator& comm, const Tensor& t) {
  const Tensor bytes = tessera::empty({static_cast<int64_t>(t.nbytes())}, {DType::u8});
  std::memcpy(bytes.raw_data(), t.raw_data(), t.nbytes());
  const Tensor all = tessera::empty({comm.size() * bytes.numel()}, {DType::u8});
  comm.all_gather(bytes, all);
  std::vector<char> out(all.nbytes());
  std::memcpy(out.data(), all.raw_data(), out.size());
  return out;
}

}  // namespace

TEST_CASE("mpi all_reduce sum, max and min equal the local reduction", "[mpi]") {
  auto comm = new_world();
  for (int64_t n : {0, 1, 6, 7, 1000003}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      check_exact_all_reduce<float>(*comm, n, op);
      check_exact_all_reduce<double>(*comm, n, op);
      check_exact_all_reduce<int64_t>(*comm, n, op);
      check_exact_all_reduce<int32_t>(*comm, n, op);
    }
  }
  // u8 sums must stay below 256: (i * 31 + r * 17) % 80 sums to at most 240 on 3 ranks.
  std::vector<uint8_t> mine(1001);
  std::vector<uint8_t> want(1001, 0);
  for (int64_t i = 0; i < 1001; ++i) {
    mine[i] = static_cast<uint8_t>((i * 31 + comm->rank() * 17) % 80);
    for (int r = 0; r < comm->size(); ++r) want[i] += static_cast<uint8_t>((i * 31 + r * 17) % 80);
  }
  const Tensor t = tessera::from_vector(mine);  // (1001)
  comm->all_reduce(t);
  CHECK(first_mismatch(t.to_vector<uint8_t>(), want) == -1);
}

TEST_CASE("mpi all_reduce gives every rank the same bits", "[mpi]") {
  // Note [Identical all_reduce results]: sums that round differently in different orders
  // must still come out bitwise equal on all ranks, and close to the exact sum.
  auto comm = new_world();
  for (int64_t n : {7, 1000003}) {
    for (DType dtype : {DType::f32, DType::f64}) {
      std::vector<double> mine(n);
      std::vector<double> want(n, 0.0);
      std::vector<double> magnitude(n, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        mine[i] = rounding_value(comm->rank(), i);
        for (int r = 0; r < comm->size(); ++r) {
          // The inputs as the tensor holds them: rounded to dtype first.
          const double x =
              dtype == DType::f32 ? static_cast<float>(rounding_value(r, i)) : rounding_value(r, i);
          want[i] += x;
          magnitude[i] += std::abs(x);
        }
      }
      const Tensor t = tessera::from_vector(mine).to(dtype);  // (n)
      comm->all_reduce(t);
      INFO("dtype " << tessera::dtype_name(dtype) << ", n " << n);
      const std::vector<char> all = gather_bytes(*comm, t);
      int differing_ranks = 0;
      for (int r = 0; r < comm->size(); ++r) {
        differing_ranks += std::memcmp(all.data() + r * t.nbytes(), t.raw_data(), t.nbytes()) != 0;
      }
      CHECK(differing_ranks == 0);
      const double eps = dtype == DType::f32 ? 1e-6 : 1e-14;
      const std::vector<double> got = t.to_vector<double>();
      int64_t far = 0;
      for (int64_t i = 0; i < n; ++i) far += std::abs(got[i] - want[i]) > eps * magnitude[i];
      CHECK(far == 0);
    }
  }
}

TEST_CASE("mpi f16 and bf16 reductions: f32 sums in rank order rounded once, on every rank",
          "[mpi]") {
  // Note [16-bit reductions]: values that no 16-bit sum holds exactly, so a rounding at
  // each hop (or any other order) would show.
  auto comm = new_world();
  const int size = comm->size();
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (int64_t n : {7, 100003}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        const auto input = [&](int r, int64_t count) {  // rank r's values, rounded to dtype
          std::vector<float> v(count);
          for (int64_t i = 0; i < count; ++i) v[i] = 1.0f + 0.013f * ((i * 7 + r * 29) % 97);
          return tessera::from_vector(v).to(dtype);
        };
        // In f32 in rank order, rounded once.
        const auto expected = [&](int64_t count) {
          std::vector<float> acc = input(0, count).to_vector<float>();
          for (int r = 1; r < size; ++r) {
            const std::vector<float> x = input(r, count).to_vector<float>();
            for (int64_t i = 0; i < count; ++i) {
              acc[i] = op == ReduceOp::sum ? acc[i] + x[i] : std::max(acc[i], x[i]);
            }
          }
          return tessera::from_vector(acc).to(dtype);
        };
        INFO("dtype " << tessera::dtype_name(dtype) << ", n " << n << ", op "
                      << tessera::parallel::reduce_op_name(op));
        const Tensor t = input(comm->rank(), n);
        comm->all_reduce(t, op);
        CHECK(std::memcmp(t.raw_data(), expected(n).raw_data(), t.nbytes()) == 0);
        const Tensor out = tessera::empty({n}, {dtype});
        comm->reduce_scatter(input(comm->rank(), size * n), out, op);
        const Tensor want = expected(size * n).narrow(0, comm->rank() * n, n);
        CHECK(std::memcmp(out.raw_data(), want.raw_data(), out.nbytes()) == 0);
      }
    }
  }
}

TEST_CASE("mpi reduce_scatter gives each rank its block of the reduction", "[mpi]") {
  auto comm = new_world();
  const int size = comm->size();
  for (int64_t n : {1, 5, 1000}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      std::vector<double> mine(size * n);
      for (int64_t i = 0; i < size * n; ++i) mine[i] = exact_as<double>(comm->rank(), i);
      std::vector<double> want(n);
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = comm->rank() * n + k;
        want[k] = exact_as<double>(0, i);
        for (int r = 1; r < size; ++r) want[k] = combine(want[k], exact_as<double>(r, i), op);
      }
      const Tensor in = tessera::from_vector(mine);          // (size * n)
      const Tensor out = tessera::zeros({n}, {DType::f64});  // (n)
      comm->reduce_scatter(in, out, op);
      INFO("n " << n << ", op " << tessera::parallel::reduce_op_name(op));
      CHECK(first_mismatch(out.to_vector<double>(), want) == -1);
      // The input is left alone.
      CHECK(first_mismatch(in.to_vector<double>(), mine) == -1);
    }
  }
}
