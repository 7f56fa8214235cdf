// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html), the
// one way Tandem marks what a lock guards. Under Clang with -Wthread-safety the compiler checks
// them; under GCC they expand to nothing and remain the documentation.
//
//   Mutex mu_;
//   int64_t queued_ TANDEM_GUARDED_BY(mu_);
//   void DrainLocked() TANDEM_REQUIRES(mu_);
//   { MutexLock lock(&mu_); ++queued_; }
//
// Mutex is std::mutex declared as a capability; MutexLock is its scoped lock. A condition wait
// uses std::condition_variable_any over std::unique_lock<Mutex> (Mutex is BasicLockable).
#pragma once

#include <mutex>

#if defined(__clang__)
#define TANDEM_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TANDEM_THREAD_ANNOTATION(x)
#endif

#define TANDEM_CAPABILITY(x) TANDEM_THREAD_ANNOTATION(capability(x))
#define TANDEM_SCOPED_CAPABILITY TANDEM_THREAD_ANNOTATION(scoped_lockable)
#define TANDEM_GUARDED_BY(x) TANDEM_THREAD_ANNOTATION(guarded_by(x))
#define TANDEM_PT_GUARDED_BY(x) TANDEM_THREAD_ANNOTATION(pt_guarded_by(x))
#define TANDEM_REQUIRES(...) TANDEM_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define TANDEM_EXCLUDES(...) TANDEM_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define TANDEM_ACQUIRE(...) TANDEM_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define TANDEM_RELEASE(...) TANDEM_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TANDEM_NO_THREAD_SAFETY_ANALYSIS TANDEM_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace tandem {

class TANDEM_CAPABILITY("mutex") Mutex {
 public:
  void lock() TANDEM_ACQUIRE() { mu_.lock(); }
  void unlock() TANDEM_RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class TANDEM_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) TANDEM_ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() TANDEM_RELEASE() { mu_->unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

}  // namespace tandem
