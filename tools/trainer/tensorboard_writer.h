// TensorBoard event files written without TensorFlow or protobuf: scalars that TensorBoard
// (and DeepSpeed's `tensorboard` monitor readers) show as curves.
//
// Note [TensorBoard event files]
// An event file is a sequence of TFRecords (tensorboard/summary/writer/record_writer.py),
// little-endian:
//     uint64 length, uint32 masked_crc32c(the 8 length bytes),
//     data[length], uint32 masked_crc32c(data)
// CRC-32C is the Castagnoli polynomial (reflected 0x82F63B78, init and final xor
// 0xFFFFFFFF); masking rotates it right by 15 bits and adds 0xA282EAD8. Each record's data
// is a serialized `Event` (tensorboard/compat/proto/event.proto): wall_time (field 1,
// double), step (2, int64 varint), and either file_version (3, string) or a Summary (5)
// whose Values (summary.proto, field 1) carry a tag (1, string) and a float simple_value
// (2): what torch.utils.tensorboard's add_scalar writes by default. Fields go in number
// order and a zero wall_time or step is omitted, as proto3 does. The file is named
// events.out.tfevents.<unix seconds, 10 digits>.<host>.<pid>.<n> and starts with the event
// file_version = "brain.Event:2". A resumed run's new file then has a SessionLog (Event
// field 7; its status, field 1, START = 1) at the first step past its checkpoint: TensorBoard
// drops the events at that step and later that it read before (its purge of orphaned data,
// what SummaryWriter(purge_step=...) asks for), so the curve does not fold back.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace tessera::train {

// CRC-32C of `data`, and its masked form (Note [TensorBoard event files]).
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

// One record of an event file: the framing around a serialized Event.
std::string tfrecord(std::string_view data);
// Serialized Events: the file-version one, and one scalar summary value.
std::string file_version_event(double wall_time);
std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time);
std::string session_start_event(int64_t step, double wall_time);

// Seconds since the Unix epoch, as Python's time.time() gives them.
double unix_time_now();

class TensorBoardWriter {
 public:
  // Creates `dir` (with its parents) and a new event file in it, named from `wall_time`,
  // the host and the process (with the lowest <n> not yet taken), and writes the
  // file-version event. Throws naming the path when it cannot.
  explicit TensorBoardWriter(const std::string& dir, double wall_time = unix_time_now());

  // Appends the scalar `value` of `tag` at `step`.
  void add_scalar(const std::string& tag, float value, int64_t step,
                  double wall_time = unix_time_now());
  // A restarted run's SessionLog START at `step`: TensorBoard forgets what it read of steps
  // `step` and later (Note [TensorBoard event files]).
  void add_session_start(int64_t step, double wall_time = unix_time_now());
  // Hands what was written to the operating system; throws naming the path on failure.
  void flush();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace tessera::train
