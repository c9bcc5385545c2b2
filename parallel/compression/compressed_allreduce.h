// DeepSpeed's error-compensated 1-bit all-reduce (compressed_allreduce in
// deepspeed/runtime/comm/nccl.py), built only from Communicator primitives and the sign-bit
// kernels, so it runs on every backend.
//
// Note [Compressed all-reduce]
// A buffer of n elements is padded with zeros to `corrected` = a multiple of W x lcm(W, 8),
// so each of the W server chunks holds whole bytes of sign bits. Then:
//   worker: y = x + e_w; s_w = |y|_2 / sqrt(corrected); e_w = y - s_w sgn(y);
//           all_to_all of the packed sign chunks, all_gather of the W scales;
//   server (rank i, chunk i): z = sum_j (s_w[j] (1/W)) sgn_j + e_s, the sum in rank order
//           (DeepSpeed scales the scales by 1/W before the sum);
//           s_s = |z|_2 / sqrt(corrected / W); e_s = z - s_s sgn(z);
//           all_gather of the packed sgn(z) and of the W scales s_s;
//   out = s_s[i] sgn(z_i) for every chunk i, unpadded: the same on every rank.
// sgn(v) is +1 for v >= 0 (zero included) and -1 otherwise, so y = s_w sgn(y) + e_w holds
// exactly after each call. A rank sends about 2 n / 8 bytes of signs and 2 W scales, where
// an f32 ring all-reduce sends about 8 n bytes. The error buffers persist across calls
// (they are the method's memory) and are part of the optimizer state. With one rank the
// buffer is left as it is (DeepSpeed skips the call).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace tessera::parallel {

class CompressedAllReduce {
 public:
  // For buffers of `numel` f32 elements on `device`, over `group`, which must outlive
  // this object.
  CompressedAllReduce(Communicator& group, int64_t numel, Device device);

  // x (numel) f32, contiguous, in place: the compressed average of the ranks' x. Collective.
  void run(const Tensor& x);

  // DeepSpeed's padded size: n rounded up to a multiple of W x lcm(W, 8).
  static int64_t padded_numel(int64_t numel, int world);

  int64_t numel() const { return numel_; }
  // The error-feedback buffers: (padded) on the worker side, (padded / W) on the server.
  const Tensor& worker_error() const { return worker_error_; }
  const Tensor& server_error() const { return server_error_; }
  // Restores both buffers (a checkpoint of this rank at the same world size); shapes,
  // dtypes and values are checked before anything is written.
  void load_errors(const Tensor& worker, const Tensor& server);
  // Zeroes both buffers (a fresh start of the error feedback).
  void reset_errors();
  // The last call's scales: this rank's worker scale and its server chunk's scale.
  float last_worker_scale() const { return last_worker_scale_; }
  float last_server_scale() const { return last_server_scale_; }

 private:
  Communicator& group_;
  int64_t numel_;
  int64_t padded_;
  Tensor worker_error_;  // (padded) f32
  Tensor server_error_;  // (padded / W) f32
  float last_worker_scale_ = 0;
  float last_server_scale_ = 0;
};

}  // namespace tessera::parallel
