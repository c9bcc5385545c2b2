#include "parallel/compression/compressed_allreduce.h"

#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/blas1.h"
#include "kernels/elementwise.h"
#include "kernels/signs.h"

namespace tessera::parallel {
namespace {

using kernels::BinaryOp;

// s = |v|_2 / sqrt(size), in f32 (the norm accumulated in f64).
float rms_scale(const Tensor& v) {
  return static_cast<float>(std::sqrt(kernels::squared_norm(v)) /
                            std::sqrt(static_cast<double>(v.numel())));
}

// e = v - s sgn(v), in place into `error`, and the packed sgn(v).
Tensor compress(const Tensor& v, float s, const Tensor& error) {
  const Tensor bits = kernels::pack_signs(v);
  const Tensor signs = kernels::unpack_signs(bits, v.numel(), DType::f32);
  const Tensor scaled =
      kernels::binary(BinaryOp::mul, signs, scalar_tensor(s, {DType::f32, v.device()}));
  error.copy_(kernels::binary(BinaryOp::sub, v, scaled));
  return bits;
}

// Every rank's `value`, in rank order.
std::vector<float> gather_scalars(Communicator& group, float value, Device device) {
  const Tensor all = empty({group.size()}, {DType::f32, device});
  group.all_gather(scalar_tensor(value, {DType::f32, device}).view({1}), all);
  return all.to(Device::cpu()).to_vector<float>();
}

}  // namespace

int64_t CompressedAllReduce::padded_numel(int64_t numel, int world) {
  const int64_t divider = std::lcm<int64_t>(world, 8);
  const int64_t unit = world * divider;
  return (numel + unit - 1) / unit * unit;
}

CompressedAllReduce::CompressedAllReduce(Communicator& group, int64_t numel, Device device)
    : group_(group),
      numel_(numel),
      padded_(padded_numel(numel, group.size())),
      worker_error_(zeros({padded_}, {DType::f32, device})),
      server_error_(zeros({padded_ / group.size()}, {DType::f32, device})) {
  TS_CHECK(numel >= 0, "[compressed_allreduce] expected numel >= 0, found ", numel);
}

void CompressedAllReduce::load_errors(const Tensor& worker, const Tensor& server) {
  TS_CHECK(worker.dtype() == DType::f32 && worker.shape() == worker_error_.shape() &&
               server.dtype() == DType::f32 && server.shape() == server_error_.shape(),
           "[compressed_allreduce] expected error buffers of f32 (", padded_, ") and (",
           padded_ / group_.size(), "), found ", worker.str(), " and ", server.str());
  NoGradGuard no_grad;
  worker_error_.copy_(worker);
  server_error_.copy_(server);
}

void CompressedAllReduce::reset_errors() {
  worker_error_.fill_(0.0);
  server_error_.fill_(0.0);
}

void CompressedAllReduce::run(const Tensor& x) {
  TS_CHECK(x.dtype() == DType::f32 && x.numel() == numel_ && x.is_contiguous() &&
               x.device() == worker_error_.device(),
           "[compressed_allreduce] expected a contiguous f32 buffer of ", numel_, " elements on ",
           worker_error_.device(), ", found ", x.str());
  const int world = group_.size();
  if (world == 1 || numel_ == 0) return;
  NoGradGuard no_grad;
  const Device device = x.device();
  const int64_t chunk = padded_ / world;  // elements of one server chunk
  const int64_t chunk_bytes = chunk / 8;

  // Worker: y = x + e_w over the padded buffer, its scale, its signs and new error.
  const Tensor y = zeros({padded_}, {DType::f32, device});
  y.narrow(0, 0, numel_).copy_(x.view({numel_}));
  kernels::axpy_(y, worker_error_);
  const float s_w = rms_scale(y);
  last_worker_scale_ = s_w;
  const Tensor worker_bits = compress(y, s_w, worker_error_);  // (padded / 8) u8

  // Phase 1: chunk i of every worker's signs to rank i; every worker's scale to all.
  const Tensor received = empty({padded_ / 8}, {DType::u8, device});
  group_.all_to_all(worker_bits, received);
  const std::vector<float> s = gather_scalars(group_, s_w, device);

  // Server, for this rank's chunk: z = sum_j (s_j (1/W)) sgn_j + e_s, j in rank order.
  // Each product is exactly +-(s_j / W), so the sum is the same however it is fused.
  const float inv_world = static_cast<float>(1.0 / world);
  const Tensor z = zeros({chunk}, {DType::f32, device});
  for (int j = 0; j < world; ++j) {
    const Tensor signs =
        kernels::unpack_signs(received.narrow(0, j * chunk_bytes, chunk_bytes), chunk, DType::f32);
    kernels::axpy_(z, signs, s[static_cast<size_t>(j)] * inv_world);
  }
  kernels::axpy_(z, server_error_);
  const float s_s = rms_scale(z);
  last_server_scale_ = s_s;
  const Tensor server_bits = compress(z, s_s, server_error_);  // (chunk / 8) u8

  // Phase 2: every server chunk's signs and scale to all; decode in rank order.
  const Tensor all_bits = empty({padded_ / 8}, {DType::u8, device});
  group_.all_gather(server_bits, all_bits);
  const std::vector<float> ss = gather_scalars(group_, s_s, device);
  const Tensor out = kernels::unpack_signs(all_bits, padded_, DType::f32);
  for (int i = 0; i < world; ++i) {
    kernels::scale_(out.narrow(0, i * chunk, chunk), ss[static_cast<size_t>(i)]);
  }
  x.view({numel_}).copy_(out.narrow(0, 0, numel_));
}

}  // namespace tessera::parallel
