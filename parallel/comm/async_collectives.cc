#include "parallel/comm/async_collectives.h"

#include <utility>

#include "core/parallel.h"

namespace tessera::parallel {

void AsyncCollectives::run_one(CommHandle::State& state) {
  std::exception_ptr error;
  try {
    state.run();
  } catch (...) {
    error = std::current_exception();
  }
  state.run = nullptr;  // releases the tensors
  std::lock_guard<std::mutex> lock(state.mutex);
  state.done = true;
  state.error = error;
  state.finished.notify_all();
}

void AsyncCollectives::queue_one(CommHandle::State& state) {
  std::exception_ptr error;
  try {
    state.queued = comm_.queue(state.run);
  } catch (...) {
    error = std::current_exception();
  }
  if (!state.queued) state.run = nullptr;  // finished (or failed): the tensors may go
  std::lock_guard<std::mutex> lock(state.mutex);
  state.done = true;
  state.error = error;
}

void CommHandle::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->finished.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
  if (!state_->queued) return;
  try {
    state_->queued->order_device_after();
  } catch (...) {
    state_->error = std::current_exception();  // every later wait() rethrows it too
    throw;
  }
}

bool CommHandle::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done && (!state_->queued || state_->queued->finished());
}

void AsyncCollectives::wait_on_host(const CommHandle& h) {
  h.wait();
  if (!h.state_ || !h.state_->queued) return;
  try {
    h.state_->queued->wait();
  } catch (...) {
    std::lock_guard<std::mutex> lock(h.state_->mutex);
    h.state_->error = std::current_exception();  // the handle's wait() rethrows it from now on
    throw;
  }
}

bool CommHandle::failed() const {
  if (!state_) return false;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done && state_->error != nullptr;
}

AsyncCollectives::AsyncCollectives(Communicator& comm) : comm_(comm) {
  if (comm.size() > 1 && comm.runs_on_any_thread()) {
    const int threads = num_threads();  // OpenMP's count is per thread: take the owner's
    worker_ = std::thread([this, threads] {
      set_num_threads(threads);
      work();
    });
  }
}

AsyncCollectives::~AsyncCollectives() {
  for (const CommHandle& h : started_) {
    try {
      wait_on_host(h);
    } catch (...) {  // reported by the handle's own wait(), or nobody's to report now
    }
  }
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_one();
    worker_.join();
  }
}

void AsyncCollectives::work() {
  for (;;) {
    std::shared_ptr<CommHandle::State> next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    comm_.set_issued_at(next->started);
    run_one(*next);
  }
}

CommHandle AsyncCollectives::start(std::function<void()> run) {
  std::erase_if(started_, [](const CommHandle& h) { return h.done() && !h.failed(); });
  auto state = std::make_shared<CommHandle::State>();
  state->run = std::move(run);
  state->started = std::chrono::steady_clock::now();
  CommHandle handle(state);
  if (!overlaps()) {
    queue_one(*state);
  } else {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(state);
    }
    queued_.notify_one();
  }
  started_.push_back(handle);
  return handle;
}

CommHandle AsyncCollectives::all_reduce(const Tensor& t, ReduceOp op) {
  return start([this, t, op] { comm_.all_reduce(t, op); });
}

CommHandle AsyncCollectives::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  return start([this, in, out, op] { comm_.reduce_scatter(in, out, op); });
}

CommHandle AsyncCollectives::all_gather(const Tensor& in, const Tensor& out) {
  return start([this, in, out] { comm_.all_gather(in, out); });
}

CommHandle AsyncCollectives::send(const Tensor& t, int dst) {
  return start([this, t, dst] { comm_.send(t, dst); });
}

CommHandle AsyncCollectives::recv(const Tensor& t, int src) {
  return start([this, t, src] { comm_.recv(t, src); });
}

void AsyncCollectives::wait_all() {
  std::exception_ptr first;
  for (const CommHandle& h : started_) {
    try {
      wait_on_host(h);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  started_.clear();
  if (first) std::rethrow_exception(first);
}

}  // namespace tessera::parallel
