// An exclusive lock on a run's directory, so that two trainers started on one config fail
// at once instead of deleting each other's in-flight checkpoints and interleaving their
// metrics.
//
//   RunLock lock(cfg.trainer.log_dir);  // throws when another process holds it
//
// Note [Run directory locks]
// The lock is flock(LOCK_EX | LOCK_NB) on `<dir>/.lock`, which holds the owner's pid for
// the error message. The kernel drops a flock when its process ends, however it ends, so
// a killed run leaves no stale lock to clean up; the file itself stays. flock locks
// belong to an open file description, so a second RunLock on one directory fails within
// one process too. On NFS, flock is emulated with fcntl locks where the server supports
// them.
#pragma once

#include <string>

#include "core/file_io.h"

namespace tessera::train {

class RunLock {
 public:
  // Creates `dir` if needed and locks it; throws tessera::Error naming the directory and
  // the pid that holds it.
  explicit RunLock(const std::string& dir);
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  UniqueFd fd_;  // the open lock file; closing it releases the lock
};

}  // namespace tessera::train
