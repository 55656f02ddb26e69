#pragma once
// C++20 coroutines over one endpoint: a worker thread runs several coroutines (queries or
// inserts); each suspends on its outstanding remote operations and is resumed when the
// completions carrying its tag have all arrived.
#include <chrono>
#include <coroutine>
#include <deque>
#include <exception>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

template <class T = void>
class Task;

namespace detail {
struct PromiseBase {
  std::coroutine_handle<> continuation;
  std::exception_ptr exception;
  std::suspend_always initial_suspend() noexcept { return {}; }
  struct Final {
    bool await_ready() noexcept { return false; }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      auto c = h.promise().continuation;
      return c ? c : std::noop_coroutine();
    }
    void await_resume() noexcept {}
  };
  Final final_suspend() noexcept { return {}; }
  void unhandled_exception() { exception = std::current_exception(); }
};
}  // namespace detail

/// Owns a coroutine handle: move-only, destroys the frame, starts it when awaited.
template <class Promise>
class TaskHandle {
 public:
  TaskHandle() = default;
  explicit TaskHandle(std::coroutine_handle<Promise> h) : h_(h) {}
  TaskHandle(TaskHandle&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  TaskHandle& operator=(TaskHandle&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  ~TaskHandle() {
    if (h_) h_.destroy();
  }
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> c) noexcept {
    h_.promise().continuation = c;
    return h_;
  }
  std::coroutine_handle<Promise> handle() const { return h_; }

 protected:
  void rethrow() const {
    if (h_.promise().exception) std::rethrow_exception(h_.promise().exception);
  }
  std::coroutine_handle<Promise> h_;
};

namespace detail {
template <class T>
struct ValuePromise : PromiseBase {
  std::optional<T> value;
  Task<T> get_return_object();
  void return_value(T v) { value = std::move(v); }
};
struct VoidPromise : PromiseBase {
  Task<void> get_return_object();
  void return_void() {}
};
}  // namespace detail

/// A lazily started coroutine returning T; awaiting it runs it to completion.
template <class T>
class Task : public TaskHandle<detail::ValuePromise<T>> {
 public:
  using promise_type = detail::ValuePromise<T>;
  using TaskHandle<promise_type>::TaskHandle;
  T await_resume() {
    this->rethrow();
    return std::move(*this->h_.promise().value);
  }
};

template <>
class Task<void> : public TaskHandle<detail::VoidPromise> {
 public:
  using promise_type = detail::VoidPromise;
  using TaskHandle<promise_type>::TaskHandle;
  void await_resume() { rethrow(); }
};

namespace detail {
template <class T>
Task<T> ValuePromise<T>::get_return_object() {
  return Task<T>(std::coroutine_handle<ValuePromise<T>>::from_promise(*this));
}
inline Task<void> VoidPromise::get_return_object() {
  return Task<void>(std::coroutine_handle<VoidPromise>::from_promise(*this));
}
}  // namespace detail

/// Per-operation accounting of one coroutine (a query or an insert).
struct IoStats {
  uint64_t reads = 0, writes = 0, atomics = 0, bytes = 0, doorbells = 0;
  IoStats& operator+=(const IoStats& o) {
    reads += o.reads;
    writes += o.writes;
    atomics += o.atomics;
    bytes += o.bytes;
    doorbells += o.doorbells;
    return *this;
  }
};

/// Runs coroutines of one thread over one endpoint. Not thread-safe (one per thread).
class Scheduler {
 public:
  explicit Scheduler(fabric::Endpoint& ep) : ep_(ep) {}
  fabric::Endpoint& endpoint() { return ep_; }

  /// Awaitable: posts `ops` (as one doorbell batch when `batch`, else one post per op) and
  /// resumes when all completed. Yields the first failure (Ok when all succeeded). The ops'
  /// tags are overwritten. `stats` is charged for the operations.
  struct Wait {
    Scheduler& s;
    std::span<fabric::Op> ops;
    bool batch;
    IoStats* stats;
    uint32_t slot = 0;
    fabric::Completion early{};
    bool await_ready() const noexcept { return ops.empty(); }
    bool await_suspend(std::coroutine_handle<> h);
    /// The first failed completion, or one with status Ok.
    fabric::Completion await_resume();
  };
  Wait io(std::span<fabric::Op> ops, bool batch, IoStats* stats = nullptr) { return Wait{*this, ops, batch, stats}; }

  /// Awaitable: gives the thread to the other coroutines; resumes after the next poll
  /// (for coroutines waiting on something other than a completion, e.g. a queue).
  struct Yield {
    Scheduler& s;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) { s.yielded_.push_back(h); }
    void await_resume() const noexcept {}
  };
  Yield yield() { return Yield{*this}; }

  /// Starts a root coroutine; it runs until its first suspension.
  void spawn(Task<void> t);
  /// Drives completions until every spawned coroutine finished; rethrows the first failure
  /// of a root coroutine (after all others finished or failed).
  void run();
  /// Drives completions once; returns the number of root coroutines still running.
  size_t step();
  size_t active() const { return roots_.size(); }

 private:
  struct Slot {
    std::coroutine_handle<> h;
    uint32_t pending = 0;
    fabric::Completion fail{};
    bool in_use = false;
  };
  uint32_t get_slot();
  void reap();
  fabric::Endpoint& ep_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  std::vector<Task<void>> roots_;
  std::vector<std::coroutine_handle<>> yielded_, resuming_, ready_;
  std::exception_ptr first_error_;
};

/// Runs one coroutine to completion on `s` (for control paths and tests).
template <class T>
T run_sync(Scheduler& s, Task<T> t) {
  std::optional<T> out;
  std::exception_ptr err;
  auto wrapper = [](Task<T> inner, std::optional<T>& o, std::exception_ptr& e) -> Task<void> {
    try {
      o = co_await inner;
    } catch (...) {
      e = std::current_exception();
    }
  };
  s.spawn(wrapper(std::move(t), out, err));
  s.run();
  if (err) std::rethrow_exception(err);
  return std::move(*out);
}
inline void run_sync(Scheduler& s, Task<void> t) {
  s.spawn(std::move(t));
  s.run();
}

/// One COMPARE_SWAP of `word` on s's endpoint; returns the value the word had. A failed
/// completion throws FabricError, prefixed by `what` (e.g. "id index").
Task<uint64_t> compare_swap(Scheduler& s, RemotePtr word, uint64_t expect, uint64_t want, IoStats* io, const char* what);

}  // namespace dmhnsw::compute
