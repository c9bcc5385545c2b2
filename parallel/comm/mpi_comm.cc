#include "parallel/comm/mpi_comm.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "parallel/comm/mpi_roll_call.h"

namespace tessera::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// Polling of Note [MPI waits under a deadline]: yield for the first kSpin, then sleep for
// kFirstPause, doubling up to kLastPause.
constexpr std::chrono::microseconds kSpin{50};
constexpr std::chrono::microseconds kFirstPause{10};
constexpr std::chrono::microseconds kLastPause{1000};
// How long a rank whose collective timed out listens for the others' answers (Note [Roll
// call] in parallel/comm/mpi_roll_call.h), at most: answers come within milliseconds.
constexpr std::chrono::milliseconds kRollCallListen{1000};

// Point-to-point messages use one tag: MPI keeps messages of one (source, tag, communicator)
// in order, which is the pairing Communicator::send/recv promise.
constexpr int kTag = 0;

// MPI's description of an error code: "MPI_ERR_TRUNCATE: message truncated".
std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return str_cat("MPI error ", code);
  return std::string(text, length);
}

// For MPI calls outside an operation (setup and teardown), which have no where() prefix.
void check_mpi(int code, const char* call, const std::string& context) {
  if (code != MPI_SUCCESS) {
    throw Error(str_cat("[", context, "] ", call, " failed: ", mpi_error_string(code)));
  }
}

// The MPI type that moves one element. f16 and bf16 travel as 16-bit words (MPI has no
// half types, and moving bytes does not need one); bool is stored as one byte.
MPI_Datatype element_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
    case DType::boolean:
      return MPI_UINT8_T;
    case DType::f16:
    case DType::bf16:
      return MPI_UINT16_T;
  }
  TS_INTERNAL_ASSERT(false, "unhandled dtype ", static_cast<int>(dtype));
  return MPI_DATATYPE_NULL;
}

struct PollResult {
  int code = MPI_SUCCESS;  // MPI's error, when the operation failed
  bool timed_out = false;
  bool stopped = false;  // `stop` said so first
};

// Tests `request` until it completes, fails or `deadline` passes (Note [MPI waits under a
// deadline]) or `stop` (when given) returns true, calling `idle` (when given) before each
// sleep.
PollResult poll(MPI_Request& request, Clock::time_point deadline, MPI_Status* status,
                const std::function<void()>& idle = {}, const std::function<bool()>& stop = {}) {
  const Clock::time_point start = Clock::now();
  std::chrono::microseconds pause = kFirstPause;
  for (;;) {
    int done = 0;
    // MPI_Test also drives MPI's progress: a nonblocking collective advances only while
    // the ranks are inside MPI calls.
    const int code = MPI_Test(&request, &done, status);
    if (code != MPI_SUCCESS || done) return {code, false};
    if (Clock::now() >= deadline) return {MPI_SUCCESS, true};
    if (stop && stop()) return {MPI_SUCCESS, false, true};
    if (Clock::now() - start < kSpin) {
      std::this_thread::yield();
    } else {
      if (idle) idle();
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, kLastPause);
    }
  }
}

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over `comm`, which it owns from now on (freed here even on error).
  static std::unique_ptr<Communicator> adopt(MPI_Comm comm, std::string name, CommOptions options);
  ~MpiCommunicator() override;

 protected:
  void do_all_reduce(const Tensor& t, ReduceOp reduce) override;
  void do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp reduce) override;
  void do_all_gather(const Tensor& in, const Tensor& out) override;
  void do_all_to_all(const Tensor& in, const Tensor& out) override;
  void do_broadcast(const Tensor& t, int root) override;
  void do_send(const Tensor& t, int dst) override;
  void do_recv(const Tensor& t, int src) override;
  void do_barrier() override;
  std::unique_ptr<Communicator> do_split(int color, int key) override;
  bool supports(Device device) const override { return device.type == DeviceType::cpu; }
  // A worker thread in one group while the owner works in another (the data-parallel
  // reductions during the model-parallel collectives of backward) needs
  // MPI_THREAD_MULTIPLE, which MpiRuntime asks for; below it every call stays on the
  // owner's thread.
  bool runs_on_any_thread() const override {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    return level >= MPI_THREAD_MULTIPLE;
  }

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::string name, CommOptions options)
      : Communicator(rank, size, std::move(name), options), comm_(comm) {}

  // Fails `op` when an MPI call returned an error, with the call and MPI's message.
  void check(CommOp op, int code, const char* call);
  // MPI counts are int; larger tensors would need chunking, which nothing needs yet.
  int count(CommOp op, int64_t numel);
  MPI_Op reduction(CommOp op, ReduceOp reduce);
  // Polls `request` (started by `call`) until it completes or the operation's timeout
  // passes (Note [MPI waits under a deadline]), answering roll calls meanwhile (Note [Roll
  // call]). `buffers` are the memory it reads or writes: on a timeout they are kept alive,
  // since MPI may still write them. The error of a timeout names `peer` for point-to-point
  // operations, and the ranks a roll call finds missing for collectives (peer -1).
  void wait(CommOp op, const char* call, MPI_Request& request, std::vector<Tensor> buffers,
            int peer = -1, MPI_Status* status = MPI_STATUS_IGNORE);

  MPI_Comm comm_;
  std::vector<Tensor> abandoned_;  // buffers of operations that timed out
  // The current operation's deadline, set by its first wait.
  Clock::time_point deadline_;
  int64_t deadline_sequence_ = -1;
  // Ranks whose roll calls the current operation's wait answered, and where they were.
  HeardPositions askers_;
};

std::unique_ptr<Communicator> MpiCommunicator::adopt(MPI_Comm comm, std::string name,
                                                     CommOptions options) {
  try {
    const std::string context = "comm " + name;
    // Errors come back as return codes (checked below) instead of aborting the job, so a
    // failure reaches the caller as a tessera::Error naming the op.
    check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", context);
    int rank = 0;
    int size = 0;
    check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", context);
    check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size", context);
    return std::unique_ptr<Communicator>(
        new MpiCommunicator(comm, rank, size, std::move(name), options));
  } catch (...) {
    MPI_Comm_free(&comm);
    throw;
  }
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After MPI_Finalize the handle is gone with the rest of MPI (a communicator that
  // outlived its MpiRuntime); freeing it then would be an error.
  if (!finalized) MPI_Comm_free(&comm_);
  // An operation that timed out may still complete and write its buffers later, and MPI
  // cannot cancel collectives: they are leaked on purpose rather than freed under MPI.
  if (!abandoned_.empty()) static_cast<void>(new std::vector<Tensor>(std::move(abandoned_)));
}

void MpiCommunicator::check(CommOp op, int code, const char* call) {
  if (code != MPI_SUCCESS) fail(op, str_cat(call, " failed: ", mpi_error_string(code)));
}

int MpiCommunicator::count(CommOp op, int64_t numel) {
  if (numel > INT_MAX) {
    fail(op, str_cat("expected at most ", INT_MAX, " elements per rank for MPI, found ", numel));
  }
  return static_cast<int>(numel);
}

MPI_Op MpiCommunicator::reduction(CommOp op, ReduceOp reduce) {
  switch (reduce) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  fail(op, str_cat("unknown reduction ", static_cast<int>(reduce)));
}

void MpiCommunicator::wait(CommOp op, const char* call, MPI_Request& request,
                           std::vector<Tensor> buffers, int peer, MPI_Status* status) {
  // The deadline belongs to the operation: all_reduce's two MPI calls share one timeout.
  if (deadline_sequence_ != sequence()) {
    deadline_sequence_ = sequence();
    deadline_ = Clock::now() + options().timeout;
    askers_.clear();
  }
  const CommPosition here{op, sequence() - 1};
  const PollResult result = poll(
      request, deadline_, status, [&] { answer_roll_calls(comm_, here, askers_, abandoned_); },
      [&] { return cancel_requested(); });
  check(op, result.code, call);
  if (result.stopped) {
    // MPI may still write into them, as after a timeout.
    for (Tensor& b : buffers) abandoned_.push_back(std::move(b));
    fail(op, str_cat("cancelled: ", cancel_reason()));
  }
  if (result.timed_out) {
    for (Tensor& b : buffers) abandoned_.push_back(std::move(b));
    const std::string timed_out = str_cat("timed out after ", options().timeout.count(), " ms");
    if (peer >= 0) {
      fail(op, str_cat(timed_out, " waiting for rank ", peer,
                       " (exited, or called a different operation)"));
    }
    const std::chrono::milliseconds listen = std::min(options().timeout, kRollCallListen);
    fail(op, str_cat(timed_out, ": ",
                     roll_call(comm_, rank(), size(), here, listen, askers_, abandoned_)));
  }
}

// Note [Identical all_reduce results]
// MPI_Allreduce does not promise that every rank gets the same bits: an implementation may
// reduce the same element in a different order on different ranks, and floating-point sums
// depend on the order. Replicas that must stay equal (data-parallel weights after a
// gradient all_reduce) would then drift apart. So all_reduce is a reduce_scatter_block,
// which reduces each element exactly once, on the one rank that owns its block, followed
// by an all_gather, which copies those bytes to everyone. The tensor is padded to a
// multiple of the group size with zeros so that the blocks are equal (MPI's *_block
// collectives need that); the padding is reduced and thrown away. The cost is the ring
// all_reduce's own: (N-1)/N of the bytes in each of the two phases.
void MpiCommunicator::do_all_reduce(const Tensor& t, ReduceOp reduce) {  // t (any shape)
  constexpr CommOp op = CommOp::all_reduce;
  const MPI_Op mpi_op = reduction(op, reduce);
  const MPI_Datatype type = element_type(t.dtype());
  const int64_t numel = t.numel();
  const int64_t block = (numel + size() - 1) / size();
  const int n = count(op, block);
  // (size * block): t itself when the blocks divide it, else a zero-padded copy.
  Tensor padded = t;
  if (block * size() != numel) {
    padded = make_tensor({block * size()}, t.dtype(), Device::cpu());
    char* bytes = static_cast<char*>(padded.raw_data());
    std::memcpy(bytes, t.raw_data(), t.nbytes());
    std::memset(bytes + t.nbytes(), 0, padded.nbytes() - t.nbytes());
  }
  const Tensor mine = make_tensor({block}, t.dtype(), Device::cpu());  // (block)
  MPI_Request request;
  check(op,
        MPI_Ireduce_scatter_block(padded.raw_data(), mine.raw_data(), n, type, mpi_op, comm_,
                                  &request),
        "MPI_Ireduce_scatter_block");
  wait(op, "MPI_Ireduce_scatter_block", request, {padded, mine});
  check(op, MPI_Iallgather(mine.raw_data(), n, type, padded.raw_data(), n, type, comm_, &request),
        "MPI_Iallgather");
  wait(op, "MPI_Iallgather", request, {padded, mine});
  if (!padded.is_same(t)) std::memcpy(t.raw_data(), padded.raw_data(), t.nbytes());
}

void MpiCommunicator::do_reduce_scatter(const Tensor& in, const Tensor& out,
                                        ReduceOp reduce) {  // in (size * n), out (n)
  constexpr CommOp op = CommOp::reduce_scatter;
  const MPI_Op mpi_op = reduction(op, reduce);
  const MPI_Datatype type = element_type(in.dtype());
  MPI_Request request;
  check(op,
        MPI_Ireduce_scatter_block(in.raw_data(), out.raw_data(), count(op, out.numel()), type,
                                  mpi_op, comm_, &request),
        "MPI_Ireduce_scatter_block");
  wait(op, "MPI_Ireduce_scatter_block", request, {in, out});
}

void MpiCommunicator::do_all_gather(const Tensor& in,
                                    const Tensor& out) {  // in (n), out (size * n)
  constexpr CommOp op = CommOp::all_gather;
  const MPI_Datatype type = element_type(in.dtype());
  const int n = count(op, in.numel());
  MPI_Request request;
  check(op, MPI_Iallgather(in.raw_data(), n, type, out.raw_data(), n, type, comm_, &request),
        "MPI_Iallgather");
  wait(op, "MPI_Iallgather", request, {in, out});
}

void MpiCommunicator::do_all_to_all(const Tensor& in,
                                    const Tensor& out) {  // in, out (size * n)
  constexpr CommOp op = CommOp::all_to_all;
  const MPI_Datatype type = element_type(in.dtype());
  const int n = count(op, in.numel() / size());
  MPI_Request request;
  check(op, MPI_Ialltoall(in.raw_data(), n, type, out.raw_data(), n, type, comm_, &request),
        "MPI_Ialltoall");
  wait(op, "MPI_Ialltoall", request, {in, out});
}

void MpiCommunicator::do_broadcast(const Tensor& t, int root) {  // t (any shape)
  constexpr CommOp op = CommOp::broadcast;
  MPI_Request request;
  check(op,
        MPI_Ibcast(t.raw_data(), count(op, t.numel()), element_type(t.dtype()), root, comm_,
                   &request),
        "MPI_Ibcast");
  wait(op, "MPI_Ibcast", request, {t});
}

void MpiCommunicator::do_send(const Tensor& t, int dst) {  // t (any shape)
  constexpr CommOp op = CommOp::send;
  MPI_Request request;
  check(op,
        MPI_Isend(t.raw_data(), count(op, t.numel()), element_type(t.dtype()), dst, kTag, comm_,
                  &request),
        "MPI_Isend");
  wait(op, "MPI_Isend", request, {t}, dst);
}

void MpiCommunicator::do_recv(const Tensor& t, int src) {  // t (any shape)
  constexpr CommOp op = CommOp::recv;
  const MPI_Datatype type = element_type(t.dtype());
  MPI_Request request;
  check(op, MPI_Irecv(t.raw_data(), count(op, t.numel()), type, src, kTag, comm_, &request),
        "MPI_Irecv");
  MPI_Status status;
  wait(op, "MPI_Irecv", request, {t}, src, &status);
  // A longer message fails in MPI_Test (MPI_ERR_TRUNCATE); a shorter one arrives quietly.
  int received = 0;
  check(op, MPI_Get_count(&status, type, &received), "MPI_Get_count");
  if (received != t.numel()) {
    fail(op, str_cat("expected ", t.numel(), " elements from rank ", src, ", found ", received));
  }
}

void MpiCommunicator::do_barrier() {
  constexpr CommOp op = CommOp::barrier;
  MPI_Request request;
  check(op, MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
  wait(op, "MPI_Ibarrier", request, {});
}

std::unique_ptr<Communicator> MpiCommunicator::do_split(int color, int key) {
  constexpr CommOp op = CommOp::split;
  // MPI_Comm_split blocks with no deadline. Exchanging (color, key) first, under the
  // deadline, proves that every rank has arrived at this split, so the split cannot hang.
  const Tensor mine = make_tensor({2}, DType::i32, Device::cpu());          // (2)
  const Tensor all = make_tensor({2 * size()}, DType::i32, Device::cpu());  // (size * 2)
  mine.data_ptr<int32_t>()[0] = color;
  mine.data_ptr<int32_t>()[1] = key;
  MPI_Request request;
  check(op,
        MPI_Iallgather(mine.raw_data(), 2, MPI_INT32_T, all.raw_data(), 2, MPI_INT32_T, comm_,
                       &request),
        "MPI_Iallgather");
  wait(op, "MPI_Iallgather", request, {mine, all});
  MPI_Comm child = MPI_COMM_NULL;
  check(op, MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child),
        "MPI_Comm_split");
  if (child == MPI_COMM_NULL) return nullptr;
  return adopt(child, str_cat(name(), ":", color), options());
}

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  int finalized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized", "mpi");
  check_mpi(MPI_Finalized(&finalized), "MPI_Finalized", "mpi");
  TS_CHECK(!finalized, "[mpi] expected MPI to be usable, found it already finalized");
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    // MULTIPLE lets AsyncCollectives call MPI from its worker while the owner calls it in
    // another group; FUNNELED is enough for the rest (Note [Asynchronous collectives] in
    // async_collectives.h).
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread",
              "mpi");
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      TS_FAIL("[mpi] expected thread level MPI_THREAD_FUNNELED (", MPI_THREAD_FUNNELED,
              ") or higher, found ", provided);
    }
    owns_mpi_ = true;
  }
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank", "mpi");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size", "mpi");
  // The processes that share this node's memory, ranked by world rank.
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node),
      "MPI_Comm_split_type", "mpi");
  check_mpi(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank", "mpi");
  MPI_Comm_free(&node);
}

MpiRuntime::~MpiRuntime() {
  if (owns_mpi_) MPI_Finalize();
}

void MpiRuntime::abort(int exit_code) const {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  // MPI_Abort should not return; if it does, the job must still end.
  std::_Exit(exit_code);
}

bool MpiRuntime::launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

std::unique_ptr<Communicator> mpi_world(const MpiRuntime& runtime, CommOptions options) {
  // MPI_Comm_idup rather than MPI_Comm_dup, so that a process that never arrives is an
  // error after the timeout rather than a hang. MPI writes the new handle when the dup
  // completes, so on a timeout the handle's memory is leaked on purpose, like abandoned
  // buffers (Note [MPI waits under a deadline]).
  TS_CHECK(options.timeout.count() > 0, "[comm world] expected a positive timeout, found ",
           options.timeout.count(), " ms");
  auto comm = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
  MPI_Request request;
  check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, comm.get(), &request), "MPI_Comm_idup", "comm world");
  const PollResult result = poll(request, Clock::now() + options.timeout, MPI_STATUS_IGNORE);
  check_mpi(result.code, "MPI_Comm_idup", "comm world");
  if (result.timed_out) {
    static_cast<void>(comm.release());
    TS_FAIL("[comm world] timed out after ", options.timeout.count(),
            " ms waiting for the other processes to create the world (one may have exited, or "
            "not reached mpi_world)");
  }
  return MpiCommunicator::adopt(*comm, "world", options);
}

}  // namespace tessera::parallel
