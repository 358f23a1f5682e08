#pragma once
// CommHandle: the future-like result of an asynchronous collective.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace mt::dist {

namespace internal {
// Completion state shared by the issuing side (handles) and the backend that finishes it.
class CommState {
 public:
  // Marks the operation finished; an empty `error` means success. Called exactly once.
  void finish(std::string error);
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Blocks until finished; returns the error message ("" on success).
  const std::string& wait();

 private:
  std::atomic<bool> done_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::string error_;
};
}  // namespace internal

// Handle of an asynchronous collective. Buffers passed to the collective must stay alive and
// untouched until wait() returns (or done() is true). Copies share the operation; when the
// last copy of an unfinished operation is destroyed it waits for it (errors are dropped), so a
// buffer is never written after its owner has gone, e.g. while unwinding an exception.
class CommHandle {
 public:
  CommHandle() = default;  // invalid: refers to no operation
  explicit CommHandle(std::shared_ptr<internal::CommState> state);
  // An operation that is already complete (size-1 communicators, zero-element collectives).
  static CommHandle completed();
  // A stream-ordered operation (NCCL on its own CUDA stream). `join` runs once, at the first
  // wait() (or when the last copy goes): it makes the compute stream follow the collective,
  // without blocking the host, and returns an error message or "". Every later use of the
  // buffers is on that stream (kernels, copies to the host, the caching allocator's frees),
  // so "done" for the caller means "ordered after": after wait(), done() is true while the
  // collective may still run on the GPU, and only work on the compute stream may touch the
  // buffers (copies to the host are on it). done() asks `poll` whether the GPU has finished
  // and, once it has, joins (a result cast or copied into the caller's buffer at the join is
  // then enqueued before done() returns true).
  static CommHandle stream_ordered(std::function<std::string()> join, std::function<bool()> poll);

  // Blocks until the collective is done; throws mt::Error with its message if it failed.
  // May be called again (it rethrows the same error). Throws on an invalid handle.
  void wait() const;
  // True once the collective has finished (successfully or not); never blocks.
  bool done() const;
  bool valid() const { return bool(owner_); }

 private:
  // One Owner per operation, shared by the handle's copies; its destructor is the implicit wait.
  struct Owner {
    std::shared_ptr<internal::CommState> state;
    std::function<std::string()> join;  // stream-ordered operations only
    std::function<bool()> poll;
    std::once_flag joined;
    void join_once();
    ~Owner();
  };
  std::shared_ptr<Owner> owner_;
};

}  // namespace mt::dist
