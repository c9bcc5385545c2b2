// The 1-bit compressed all-reduce (Note [Compressed all-reduce]) on thread ranks against a
// plain reimplementation of DeepSpeed's algorithm written here with loops over floats:
// a vector computed by hand from that algorithm, then random inputs of
// sizes that are not multiples of 8 x W, with exact zeros, over several calls so the error
// feedback carries; outputs, both error buffers and the scales must agree exactly, and
// y = s sgn(y) + e must hold (e is y - s sgn(y) rounded once).
#include "parallel/compression/compressed_allreduce.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <mutex>
#include <numeric>
#include <vector>

#include "core/factories.h"
#include "core/philox.h"
#include "kernels/blas1.h"
#include "parallel/comm/thread_comm.h"

namespace tessera::parallel {
namespace {

using Vec = std::vector<float>;

float sgn(float v) { return v < 0 ? -1.f : 1.f; }

// |v| / sqrt(size) with the library's f64 norm (the one piece shared with the code under
// test; its summation order is not what this test is about).
float scale_of(const Vec& v) {
  return static_cast<float>(std::sqrt(kernels::squared_norm(from_vector(v))) /
                            std::sqrt(static_cast<double>(v.size())));
}

// DeepSpeed's algorithm on all ranks at once, in plain loops.
struct Reference {
  int world;
  int64_t n, padded, chunk;
  std::vector<Vec> worker_error, server_error;
  std::vector<float> worker_scales, server_scales;

  Reference(int w, int64_t numel) : world(w), n(numel) {
    const int64_t unit = w * std::lcm<int64_t>(w, 8);
    padded = (n + unit - 1) / unit * unit;
    chunk = padded / w;
    worker_error.assign(w, Vec(padded, 0.f));
    server_error.assign(w, Vec(chunk, 0.f));
  }

  // Every rank's input -> the output (the same on every rank).
  Vec run(const std::vector<Vec>& x) {
    std::vector<Vec> signs(world);
    worker_scales.assign(world, 0.f);
    for (int r = 0; r < world; ++r) {
      Vec y(padded, 0.f);
      for (int64_t k = 0; k < n; ++k) y[k] = x[r][k];
      for (int64_t k = 0; k < padded; ++k) y[k] = y[k] + worker_error[r][k];
      const float s = scale_of(y);
      worker_scales[r] = s;
      signs[r].resize(padded);
      for (int64_t k = 0; k < padded; ++k) {
        signs[r][k] = sgn(y[k]);
        worker_error[r][k] = y[k] - s * signs[r][k];
      }
    }
    Vec out(padded);
    server_scales.assign(world, 0.f);
    const float inv_world = static_cast<float>(1.0 / world);
    for (int i = 0; i < world; ++i) {
      Vec z(chunk, 0.f);
      for (int j = 0; j < world; ++j) {
        const float c = worker_scales[j] * inv_world;  // DeepSpeed scales the scales first
        for (int64_t k = 0; k < chunk; ++k) z[k] = z[k] + c * signs[j][i * chunk + k];
      }
      for (int64_t k = 0; k < chunk; ++k) z[k] = z[k] + server_error[i][k];
      const float s = scale_of(z);
      server_scales[i] = s;
      for (int64_t k = 0; k < chunk; ++k) {
        server_error[i][k] = z[k] - s * sgn(z[k]);
        out[i * chunk + k] = s * sgn(z[k]);
      }
    }
    out.resize(n);
    return out;
  }
};

struct RankOut {
  Vec out, worker_error, server_error;
  float worker_scale = 0, server_scale = 0;
};

// `calls` compressed all-reduces of inputs(rank, call) on `world` thread ranks.
std::vector<std::vector<RankOut>> run_ranks(int world, int64_t n, int calls,
                                            const std::function<Vec(int, int)>& input) {
  std::vector<std::vector<RankOut>> got(calls, std::vector<RankOut>(world));
  std::mutex mutex;
  run_thread_ranks(world, [&](Communicator& group) {
    CompressedAllReduce car(group, n, Device::cpu());
    for (int c = 0; c < calls; ++c) {
      const Tensor x = from_vector(input(group.rank(), c));
      car.run(x);
      RankOut o{x.to_vector<float>(), car.worker_error().to_vector<float>(),
                car.server_error().to_vector<float>(), car.last_worker_scale(),
                car.last_server_scale()};
      std::lock_guard<std::mutex> lock(mutex);
      got[c][group.rank()] = std::move(o);
    }
  });
  return got;
}

TEST_CASE("compressed all-reduce reproduces the reference document's hand vector",
          "[compression]") {
  auto input = [](int r, int) {
    Vec x(16);
    for (int k = 0; k < 16; ++k) {
      x[k] = r == 0 ? 0.5f * (k - 7.5f) : 0.1f * (k % 2 ? -1.f : 1.f) * (k + 1);
    }
    return x;
  };
  const auto got = run_ranks(2, 16, 1, input)[0];
  CHECK(got[0].worker_scale == Approx(2.304886).epsilon(1e-6));
  CHECK(got[1].worker_scale == Approx(0.966954).epsilon(1e-6));
  for (int r = 0; r < 2; ++r) {
    CHECK(got[r].server_scale == Approx(1.24975).epsilon(1e-5));
    for (int k = 0; k < 16; ++k) {
      CHECK(got[r].out[k] == Approx(k < 8 ? -1.24975 : 1.24975).epsilon(1e-5));
    }
  }
  CHECK(got[0].worker_error[0] == Approx(-1.445114).epsilon(1e-6));
}

TEST_CASE("compressed all-reduce equals the plain reference exactly, call after call",
          "[compression]") {
  for (int world : {2, 3, 4}) {
    for (int64_t n : {1, 37, 101}) {  // none a multiple of 8 x W
      DYNAMIC_SECTION("world " << world << ", n " << n) {
        auto input = [n](int r, int c) {
          Vec x(n);
          for (int64_t k = 0; k < n; ++k) {
            const uint32_t u = philox4x32(static_cast<uint64_t>(k), r * 16 + c, 9)[0];
            // Every fifth element an exact zero; the rest spread over two decades.
            x[k] = u % 5 == 0 ? 0.f : (static_cast<float>(u % 2001) - 1000.f) / 97.f;
          }
          return x;
        };
        constexpr int kCalls = 3;
        const auto got = run_ranks(world, n, kCalls, input);
        Reference ref(world, n);
        for (int c = 0; c < kCalls; ++c) {
          std::vector<Vec> x;
          for (int r = 0; r < world; ++r) x.push_back(input(r, c));
          const Vec want = ref.run(x);
          for (int r = 0; r < world; ++r) {
            INFO("call " << c << ", rank " << r);
            CHECK(got[c][r].out == want);
            CHECK(got[c][r].out == got[c][0].out);  // identical on every rank
            CHECK(got[c][r].worker_scale == ref.worker_scales[r]);
            CHECK(got[c][r].server_scale == ref.server_scales[r]);
            CHECK(got[c][r].worker_error == ref.worker_error[r]);
            CHECK(got[c][r].server_error == ref.server_error[r]);
          }
        }
      }
    }
  }
}

TEST_CASE("after a call y = s sgn(y) + e holds on every rank", "[compression]") {
  const int world = 3;
  const int64_t n = 50;
  const int64_t padded = CompressedAllReduce::padded_numel(n, world);
  CHECK(padded == 72);  // 3 x lcm(3, 8) = 72
  run_thread_ranks(world, [&](Communicator& group) {
    CompressedAllReduce car(group, n, Device::cpu());
    Vec v(n);
    for (int64_t k = 0; k < n; ++k) v[k] = std::sin(0.3f * k + group.rank());
    car.run(from_vector(v));
    const Vec e = car.worker_error().to_vector<float>();
    const float s = car.last_worker_scale();
    for (int64_t k = 0; k < padded; ++k) {
      const float y = k < n ? v[k] : 0.f;  // the first call's error buffer started at zero
      // e is y - s sgn(y) rounded once, so s sgn(y) + e gives y back to that rounding.
      TS_CHECK(e[k] == y - s * sgn(y), "the error at ", k, " is not y - s sgn(y)");
      TS_CHECK(std::abs(s * sgn(y) + e[k] - y) <= 1.2e-7f * std::max(std::abs(y), s),
               "y = s sgn(y) + e broken at ", k);
    }
  });
  // One rank: the buffer is left as it is.
  run_thread_ranks(1, [&](Communicator& group) {
    CompressedAllReduce car(group, 3, Device::cpu());
    const Tensor x = from_vector<float>({1.f, -2.f, 3.f});
    car.run(x);
    TS_CHECK(x.to_vector<float>() == Vec({1.f, -2.f, 3.f}), "a group of one changed the buffer");
  });
}

}  // namespace
}  // namespace tessera::parallel
