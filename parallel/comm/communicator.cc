#include "parallel/comm/communicator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/factories.h"
#include "core/half_convert.h"

namespace tessera::parallel {

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce:
      return "all_reduce";
    case CommOp::reduce_scatter:
      return "reduce_scatter";
    case CommOp::all_gather:
      return "all_gather";
    case CommOp::all_to_all:
      return "all_to_all";
    case CommOp::broadcast:
      return "broadcast";
    case CommOp::send:
      return "send";
    case CommOp::recv:
      return "recv";
    case CommOp::barrier:
      return "barrier";
    case CommOp::split:
      return "split";
  }
  return "unknown op";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "unknown reduction";
}

double SimulatedLink::seconds(int64_t bytes, int64_t steps) const {
  if (!enabled()) return 0;
  return latency_us * 1e-6 * static_cast<double>(steps) +
         static_cast<double>(bytes) * 8 / (gbit_per_s * 1e9);
}

int64_t ring_steps(CommOp op, int size) {
  if (size <= 1) return 0;
  switch (op) {
    case CommOp::all_reduce:
      return 2 * (size - 1);
    case CommOp::reduce_scatter:
    case CommOp::all_gather:
    case CommOp::all_to_all:
      return size - 1;
    case CommOp::broadcast:
    case CommOp::send:
    case CommOp::recv:
      return 1;
    case CommOp::barrier:
    case CommOp::split:
      return 0;
  }
  return 0;
}

void CommStats::add(CommOp op, int64_t bytes_sent, double simulated_seconds) {
  Op& o = ops_[static_cast<int>(op)];
  ++o.calls;
  o.bytes_sent += bytes_sent;
  o.simulated_seconds += simulated_seconds;
}

void CommStats::add(const CommStats& other) {
  for (size_t i = 0; i < ops_.size(); ++i) {
    ops_[i].calls += other.ops_[i].calls;
    ops_[i].bytes_sent += other.ops_[i].bytes_sent;
    ops_[i].simulated_seconds += other.ops_[i].simulated_seconds;
  }
}

int64_t CommStats::total_bytes_sent() const {
  int64_t total = 0;
  for (const Op& o : ops_) total += o.bytes_sent;
  return total;
}

double CommStats::total_simulated_seconds() const {
  double total = 0;
  for (const Op& o : ops_) total += o.simulated_seconds;
  return total;
}

std::string CommStats::summary() const {
  std::string out;
  for (int i = 0; i < kNumCommOps; ++i) {
    if (ops_[i].calls == 0) continue;
    char line[160];
    std::snprintf(line, sizeof(line), "%s%s: %lld calls, %.2f MB sent", out.empty() ? "" : "\n",
                  comm_op_name(static_cast<CommOp>(i)), static_cast<long long>(ops_[i].calls),
                  static_cast<double>(ops_[i].bytes_sent) / 1e6);
    out += line;
    if (ops_[i].simulated_seconds > 0) {
      std::snprintf(line, sizeof(line), ", %.3f s on the simulated link",
                    ops_[i].simulated_seconds);
      out += line;
    }
  }
  return out;
}

Communicator::Communicator(int rank, int size, std::string name, CommOptions options)
    : rank_(rank), size_(size), name_(std::move(name)), options_(options) {
  TS_CHECK(size >= 1 && rank >= 0 && rank < size, "[comm ", name_,
           "] expected 0 <= rank < size, found rank ", rank, " and size ", size);
  TS_CHECK(options.timeout.count() > 0, "[comm ", name_, "] expected a positive timeout, found ",
           options.timeout.count(), " ms");
}

void Communicator::set_simulated_link(const SimulatedLink& link) {
  TS_CHECK(std::isfinite(link.gbit_per_s) && link.gbit_per_s >= 0, "[comm ", name_,
           "] simulated link: expected a bandwidth >= 0 Gbit/s (0: no simulated link), found ",
           link.gbit_per_s);
  TS_CHECK(std::isfinite(link.latency_us) && link.latency_us >= 0, "[comm ", name_,
           "] simulated link: expected a latency >= 0 us, found ", link.latency_us);
  TS_CHECK(link.enabled() || link.latency_us == 0, "[comm ", name_,
           "] simulated link: a latency of ", link.latency_us,
           " us needs a bandwidth, but gbit_per_s is 0, which switches the link off; set "
           "both, or neither");
  link_ = link;
}

std::string Communicator::where(CommOp op) const {
  return str_cat("[comm ", name_, ", rank ", rank_, " of ", size_, "] ", comm_op_name(op), " #",
                 sequence_ - 1);
}

CommStats Communicator::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

void Communicator::reset_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_ = CommStats();
}

void Communicator::cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  if (cancel_requested()) return;  // the first reason stays
  cancel_reason_ = reason;
  cancel_requested_.store(true, std::memory_order_release);
}

std::string Communicator::cancel_reason() const {
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  return cancel_reason_;
}

void Communicator::add_stats(const CommStats& stats) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.add(stats);
}

void Communicator::mark_broken(const std::string& reason) {
  if (!broken_reason_.empty()) return;
  broken_reason_ = reason;
  on_broken(broken_reason_);
}

void Communicator::fail(CommOp op, const std::string& reason) {
  throw Error(str_cat(where(op), ": ", reason));
}

void Communicator::check_tensor(CommOp op, const char* arg, const Tensor& t) {
  if (!t.defined()) fail(op, str_cat(arg, " is undefined"));
  if (!t.is_contiguous()) fail(op, str_cat(arg, " must be contiguous"));
  // A group of one moves no data, so any device will do (Note [A group of one]).
  if (size_ > 1 && !supports(t.device())) {
    fail(op, str_cat(arg, " is on ", t.device().str(), ", which this backend cannot communicate"));
  }
}

void Communicator::check_peer(CommOp op, const char* arg, int peer) {
  if (peer < 0 || peer >= size_) {
    fail(op, str_cat("expected ", arg, " in [0, ", size_, "), found ", peer));
  }
}

void Communicator::check_reducible(CommOp op, const Tensor& t) {
  const DType dtype = t.dtype();
  if (is_half(dtype)) {
    if (!t.device().is_cpu() && !reduces_16_bit()) {
      fail(op, str_cat("this backend reduces 16-bit tensors on the CPU only (Note [16-bit "
                       "reductions]); found ",
                       t.str(), ": reduce it in f32"));
    }
    return;
  }
  if (dtype != DType::f32 && dtype != DType::f64 && dtype != DType::i32 && dtype != DType::i64 &&
      dtype != DType::u8) {
    fail(op, str_cat("reductions support f32, f64, i32, i64, u8, f16 and bf16, found ",
                     dtype_name(dtype)));
  }
}

namespace {

// acc[i] = op(acc[i], float(block[i])) for i < n; 16-bit block.
void reduce_half_into(float* acc, const Tensor& block, int64_t n, ReduceOp op) {
  std::vector<float> values(static_cast<size_t>(n));
  if (block.dtype() == DType::bf16) {
    bf16_to_f32(block.data_ptr<BFloat16>(), values.data(), n);
  } else {
    f16_to_f32(block.data_ptr<Half>(), values.data(), n);
  }
  for (int64_t i = 0; i < n; ++i) {
    switch (op) {
      case ReduceOp::sum:
        acc[i] += values[i];
        break;
      case ReduceOp::max:
        acc[i] = std::max(acc[i], values[i]);
        break;
      case ReduceOp::min:
        acc[i] = std::min(acc[i], values[i]);
        break;
    }
  }
}

// out (n, 16-bit) = op over the `ranks` blocks of n values in `received` (rank order),
// computed in f32 and rounded once.
void reduce_blocks(const Tensor& received, int ranks, const Tensor& out, ReduceOp op) {
  const int64_t n = out.numel();
  std::vector<float> acc(static_cast<size_t>(n));
  const Tensor first = received.narrow(0, 0, n);
  if (first.dtype() == DType::bf16) {
    bf16_to_f32(first.data_ptr<BFloat16>(), acc.data(), n);
  } else {
    f16_to_f32(first.data_ptr<Half>(), acc.data(), n);
  }
  for (int r = 1; r < ranks; ++r) reduce_half_into(acc.data(), received.narrow(0, r * n, n), n, op);
  if (out.dtype() == DType::bf16) {
    f32_to_bf16(acc.data(), out.data_ptr<BFloat16>(), n);
  } else {
    f32_to_f16(acc.data(), out.data_ptr<Half>(), n);
  }
}

}  // namespace

void Communicator::half_all_reduce(const Tensor& t, ReduceOp op) {  // t (any shape), 16-bit
  const int64_t numel = t.numel();
  const int64_t block = (numel + size_ - 1) / size_;
  // (size * block): t's values, zero-padded so that the blocks are equal.
  const Tensor padded = zeros({block * size_}, {t.dtype(), Device::cpu()});
  padded.narrow(0, 0, numel).copy_(t.reshape({numel}));
  const Tensor received = empty({block * size_}, {t.dtype(), Device::cpu()});
  do_all_to_all(padded, received);  // block r of received: rank r's copy of my block
  const Tensor mine = empty({block}, {t.dtype(), Device::cpu()});
  reduce_blocks(received, size_, mine, op);
  do_all_gather(mine, padded);
  t.copy_(padded.narrow(0, 0, numel).reshape(t.shape()));
}

void Communicator::half_reduce_scatter(const Tensor& in, const Tensor& out,
                                       ReduceOp op) {  // in (size * n), out (n), 16-bit
  const Tensor received = empty({in.numel()}, {in.dtype(), Device::cpu()});
  do_all_to_all(in.reshape({in.numel()}), received);  // block r: rank r's copy of my block
  reduce_blocks(received, size_, out.reshape({out.numel()}), op);
}

void Communicator::check_pair(CommOp op, const Tensor& in, const Tensor& out,
                              int64_t out_per_in_num, int64_t out_per_in_den) {
  check_tensor(op, "in", in);
  check_tensor(op, "out", out);
  if (in.dtype() != out.dtype() || in.device() != out.device()) {
    fail(op, str_cat("expected in and out of one dtype and device, found ", in.str(), " and ",
                     out.str()));
  }
  if (out.numel() * out_per_in_den != in.numel() * out_per_in_num) {
    fail(op, str_cat("expected out to hold ", in.numel() * out_per_in_num / out_per_in_den,
                     " elements for ", in.numel(), " in ", size_, " ranks, found ", out.numel()));
  }
  // Backends read `in` while writing `out` (MPI forbids aliased buffers outright).
  const char* in_begin = static_cast<const char*>(in.raw_data());
  const char* out_begin = static_cast<const char*>(out.raw_data());
  if (in.nbytes() > 0 && out.nbytes() > 0 && in_begin < out_begin + out.nbytes() &&
      out_begin < in_begin + in.nbytes()) {
    fail(op, "expected in and out in separate memory, found them overlapping");
  }
}

namespace {

// The bytes one operation moved through this rank's link, each way.
struct Traffic {
  int64_t sent = 0;  // Note [Bytes sent]
  int64_t received = 0;
};

// A ring algorithm's traffic, the same both ways.
Traffic both_ways(int64_t bytes) { return {bytes, bytes}; }

}  // namespace

template <class F>
void Communicator::run(CommOp op, F&& f) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point issued = issued_at_.value_or(Clock::now());
  issued_at_.reset();
  ++sequence_;
  if (!broken_reason_.empty()) {
    throw Error(
        str_cat(where(op), ": the group is unusable after an earlier failure: ", broken_reason_));
  }
  Traffic traffic;
  try {
    if (cancel_requested()) fail(op, str_cat("cancelled: ", cancel_reason()));
    traffic = f();
  } catch (const Error& e) {
    mark_broken(e.what());
    throw;
  }
  // Note [Simulated link]: the link's time for the operation, on this rank's timeline.
  const double modeled =
      link_.seconds(std::max(traffic.sent, traffic.received), ring_steps(op, size_));
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.add(op, traffic.sent, modeled);
  }
  if (modeled > 0) {
    const Clock::time_point returned = Clock::now();
    // A receive's message was there when the backend returned (Note [Simulated link]).
    const Clock::time_point start = std::max(issued, link_free_at_);
    const Clock::time_point link_done =
        (op == CommOp::recv ? std::max(start, returned) : start) +
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(modeled));
    link_free_at_ = std::max(link_done, returned);
    if (link_done > returned) std::this_thread::sleep_until(link_done);
  }
}

std::unique_ptr<QueuedWork> Communicator::queue(const std::function<void()>& ops) {
  ops();
  return nullptr;
}

// Note [A group of one]
// With one rank every collective is the identity (or a copy from in to out), so the base
// class performs it without the backend: a single-process run can keep its tensors on a
// CUDA device behind any communicator, the trainer's default group of one included.

namespace {

// `factor` x (N - 1) / N of `bytes`: a ring algorithm's share per rank (Note [Bytes sent]),
// sent and received alike.
Traffic ring_share(size_t bytes, int size, int factor = 1) {
  return both_ways(static_cast<int64_t>(bytes) * factor * (size - 1) / size);
}

}  // namespace

void Communicator::all_reduce(const Tensor& t, ReduceOp op) {
  run(CommOp::all_reduce, [&] {
    check_tensor(CommOp::all_reduce, "t", t);
    check_reducible(CommOp::all_reduce, t);
    if (size_ > 1) {
      if (is_half(t.dtype()) && !reduces_16_bit()) {
        half_all_reduce(t, op);
      } else {
        do_all_reduce(t, op);
      }
    }
    return ring_share(t.nbytes(), size_, 2);
  });
}

void Communicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  run(CommOp::reduce_scatter, [&] {
    check_pair(CommOp::reduce_scatter, in, out, 1, size_);
    check_reducible(CommOp::reduce_scatter, in);
    if (size_ > 1) {
      if (is_half(in.dtype()) && !reduces_16_bit()) {
        half_reduce_scatter(in, out, op);
      } else {
        do_reduce_scatter(in, out, op);
      }
    } else {
      out.copy_(in);
    }
    return ring_share(in.nbytes(), size_);
  });
}

void Communicator::all_gather(const Tensor& in, const Tensor& out) {
  run(CommOp::all_gather, [&] {
    check_pair(CommOp::all_gather, in, out, size_, 1);
    if (size_ > 1) {
      do_all_gather(in, out);
    } else {
      out.copy_(in);
    }
    return ring_share(out.nbytes(), size_);
  });
}

void Communicator::all_to_all(const Tensor& in, const Tensor& out) {
  run(CommOp::all_to_all, [&] {
    check_pair(CommOp::all_to_all, in, out, 1, 1);
    if (in.numel() % size_ != 0) {
      fail(CommOp::all_to_all,
           str_cat("expected a multiple of ", size_, " elements, found ", in.numel()));
    }
    if (size_ > 1) {
      do_all_to_all(in, out);
    } else {
      out.copy_(in);
    }
    return ring_share(in.nbytes(), size_);
  });
}

void Communicator::broadcast(const Tensor& t, int root) {
  run(CommOp::broadcast, [&] {
    check_tensor(CommOp::broadcast, "t", t);
    check_peer(CommOp::broadcast, "root", root);
    if (size_ > 1) do_broadcast(t, root);
    if (size_ == 1) return Traffic{};
    const auto bytes = static_cast<int64_t>(t.nbytes());
    return root == rank_ ? Traffic{bytes, 0} : Traffic{0, bytes};
  });
}

void Communicator::send(const Tensor& t, int dst) {
  run(CommOp::send, [&] {
    check_tensor(CommOp::send, "t", t);
    check_peer(CommOp::send, "dst", dst);
    if (dst == rank_) fail(CommOp::send, "cannot send to itself");
    do_send(t, dst);
    return Traffic{static_cast<int64_t>(t.nbytes()), 0};
  });
}

void Communicator::recv(const Tensor& t, int src) {
  run(CommOp::recv, [&] {
    check_tensor(CommOp::recv, "t", t);
    check_peer(CommOp::recv, "src", src);
    if (src == rank_) fail(CommOp::recv, "cannot receive from itself");
    do_recv(t, src);
    return Traffic{0, static_cast<int64_t>(t.nbytes())};
  });
}

void Communicator::barrier() {
  run(CommOp::barrier, [&] {
    do_barrier();
    return Traffic{};
  });
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  std::unique_ptr<Communicator> group;
  run(CommOp::split, [&] {
    group = do_split(color, key);
    return Traffic{};
  });
  if (group) group->link_ = link_;  // the child's ranks sit behind the same links
  return group;
}

}  // namespace tessera::parallel
