#include "parallel/comm/mpi_roll_call.h"

#include <optional>
#include <thread>

#include "core/error.h"

namespace tessera::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// Apart from Communicator::send/recv's tag 0, so a roll call never pairs with data: the
// largest tag every MPI accepts (MPI_TAG_UB is at least 32767).
constexpr int kRollCallTag = 32767;

// A message: {kind, op, number}.
enum Kind : int64_t { kAsk = 1, kAnswer = 2 };

// Sends {kind, here} to `dst` without waiting for it; errors are ignored (the peer may be
// gone, and the roll call only adds to an error already being reported).
void post(MPI_Comm comm, int dst, Kind kind, CommPosition here, std::vector<Tensor>& keep) {
  Tensor message = make_tensor({3}, DType::i64, Device::cpu());  // (3)
  int64_t* m = message.data_ptr<int64_t>();
  m[0] = kind;
  m[1] = static_cast<int64_t>(here.op);
  m[2] = here.number;
  MPI_Request request;
  if (MPI_Isend(m, 3, MPI_INT64_T, dst, kRollCallTag, comm, &request) == MPI_SUCCESS) {
    MPI_Request_free(&request);
  }
  keep.push_back(std::move(message));
}

struct Received {
  int source = -1;
  Kind kind = kAsk;
  CommPosition position;
};

// The next roll-call message that has arrived, if any.
std::optional<Received> receive(MPI_Comm comm) {
  int arrived = 0;
  MPI_Status status;
  if (MPI_Iprobe(MPI_ANY_SOURCE, kRollCallTag, comm, &arrived, &status) != MPI_SUCCESS ||
      !arrived) {
    return std::nullopt;
  }
  int64_t m[3] = {0, 0, 0};
  if (MPI_Recv(m, 3, MPI_INT64_T, status.MPI_SOURCE, kRollCallTag, comm, MPI_STATUS_IGNORE) !=
          MPI_SUCCESS ||
      m[1] < 0 || m[1] >= kNumCommOps) {
    return std::nullopt;
  }
  return Received{status.MPI_SOURCE, static_cast<Kind>(m[0]), {static_cast<CommOp>(m[1]), m[2]}};
}

std::string position_name(CommPosition p) { return str_cat(comm_op_name(p.op), " #", p.number); }

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (const int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

void answer_roll_calls(MPI_Comm comm, CommPosition here, HeardPositions& askers,
                       std::vector<Tensor>& keep) {
  while (const std::optional<Received> m = receive(comm)) {
    if (m->kind != kAsk) continue;  // a late answer to an earlier roll call
    post(comm, m->source, kAnswer, here, keep);
    askers[m->source] = m->position;
  }
}

std::string roll_call(MPI_Comm comm, int rank, int size, CommPosition here,
                      std::chrono::milliseconds listen, HeardPositions heard,
                      std::vector<Tensor>& keep) {
  for (int r = 0; r < size; ++r) {
    if (r != rank) post(comm, r, kAsk, here, keep);
  }
  const Clock::time_point deadline = Clock::now() + listen;
  while (static_cast<int>(heard.size()) < size - 1 && Clock::now() < deadline) {
    if (const std::optional<Received> m = receive(comm)) {
      heard[m->source] = m->position;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::vector<int> silent;
  std::string elsewhere;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const auto it = heard.find(r);
    if (it == heard.end()) {
      silent.push_back(r);
    } else if (it->second.op != here.op || it->second.number != here.number) {
      elsewhere += str_cat("; rank ", r, " is in ", position_name(it->second));
    }
  }
  if (silent.empty() && elsewhere.empty()) {
    return "every rank has arrived, but MPI did not complete the operation";
  }
  const std::string missing =
      silent.empty()
          ? std::string()
          : str_cat("rank(s) ", rank_list(silent), " did not answer a roll call in ",
                    listen.count(), " ms (exited, stopped, or busy outside communication)");
  return missing.empty() ? elsewhere.substr(2) : missing + elsewhere;
}

}  // namespace tessera::parallel
