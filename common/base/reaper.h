// Lets go of objects on a thread of its own: for objects whose last reference may take long to
// drop, held by threads that must not wait. An NCCL link's teardown (kvtransfer/nccl) aborts its
// communicator and frees GPU memory, and a cudaFree waits for the whole GPU to go idle, which
// includes another link's receives waiting on a dead peer (up to transfer.timeout_s); the
// threads that let go of links are an engine's, between forward passes, and the I/O thread.
//
//   Reaper reaper;             // one thread, started here
//   reaper.Drop(std::move(p)); // returns at once; p's last reference goes on that thread
//   reaper.Flush();            // returns once everything dropped before it was let go
//
// Objects are let go in the order they were dropped, one at a time. An object's destructor runs
// on the reaper's thread only when the reaper held its last reference; its owner must keep alive
// whatever the destructor touches until then (Flush, or the reaper's destructor, waits for it).
// Thread-safe; Drop and Flush must not be called from a destructor the reaper runs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "common/base/thread_annotations.h"

namespace tandem {

class Reaper {
 public:
  Reaper();
  // Lets go of what is still queued, then ends the thread: waits as long as those take.
  ~Reaper();
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  // Queues `object`'s reference (nullptr: nothing). Never waits on another object's teardown.
  void Drop(std::shared_ptr<void> object);
  // Returns once every object dropped before this call was let go.
  void Flush();
  // Objects dropped and not let go yet (the one being let go included).
  uint64_t pending() const;

 private:
  void Run();

  mutable Mutex mutex_;
  std::condition_variable_any wake_;  // the thread: something queued, or stop
  std::condition_variable_any gone_;  // Flush: another object let go
  std::deque<std::shared_ptr<void>> queue_ TANDEM_GUARDED_BY(mutex_);
  uint64_t dropped_ TANDEM_GUARDED_BY(mutex_) = 0;  // ever queued
  uint64_t let_go_ TANDEM_GUARDED_BY(mutex_) = 0;   // ever let go
  bool stop_ TANDEM_GUARDED_BY(mutex_) = false;
  std::thread thread_;  // last: starts once the rest is made
};

}  // namespace tandem
