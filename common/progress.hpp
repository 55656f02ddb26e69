#pragma once
// A progress display for long work (builds, data generation, ground truth).
//
//   Progress p("inserting", n, "vectors");
//   ... p.add(1) from any thread ...
//   p.finish();  // "inserting: 1000000 vectors in 3:08 (5.3k vectors/s)"
//
// add() is one relaxed atomic add: workers never wait on the output. A thread of the
// Progress draws every period: on a terminal one line on stderr redrawn with \r (label, bar,
// done/total, percent, rate, ETA), ~5 times a second; otherwise (logs, CI, pipes) a plain line
// every DMHNSW_PROGRESS_SECONDS (default 10) and never a \r. DMHNSW_PROGRESS=0 silences it.
// Output goes to stderr so that reports and JSON on stdout are unaffected.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace dmhnsw {

struct ProgressOptions {
  std::FILE* out = stderr;
  /// Redraw one line with \r. Default: `out` is a tty and TERM is set and not "dumb".
  std::optional<bool> terminal;
  /// Time between draws. Default: 200 ms on a terminal, else DMHNSW_PROGRESS_SECONDS (10 s).
  std::optional<std::chrono::milliseconds> period;
  /// false: count only, print nothing (DMHNSW_PROGRESS=0 also turns the output off).
  bool enabled = true;
};

class Progress {
 public:
  /// total 0: unknown (no bar, percent or ETA).
  Progress(std::string label, uint64_t total, std::string unit = "items", ProgressOptions o = {});
  /// Without finish() (an exception unwinding): stops drawing and ends a terminal line, no summary.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(uint64_t n = 1) { done_.fetch_add(n, std::memory_order_relaxed); }
  /// For work that counts by itself: the absolute amount done.
  void set(uint64_t done) { done_.store(done, std::memory_order_relaxed); }
  uint64_t done() const { return done_.load(std::memory_order_relaxed); }
  /// Stops drawing and prints the final line: amount, elapsed time, mean rate. Idempotent.
  void finish();

  bool enabled() const { return enabled_; }
  bool terminal() const { return terminal_; }
  std::chrono::milliseconds period() const { return period_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Sample {
    Clock::time_point t;
    uint64_t done;
  };
  void run();
  void stop_thread();
  void draw();
  void write(const std::string& s);
  std::string plain_line(uint64_t d, double secs, double rate) const;
  std::string terminal_line(uint64_t d, double rate) const;

  const std::string label_, unit_;
  const uint64_t total_;
  std::FILE* out_;
  bool enabled_ = false, terminal_ = false;
  std::chrono::milliseconds period_{10000};
  const Clock::time_point t0_;
  std::atomic<uint64_t> done_{0};
  std::deque<Sample> window_;    // the drawing thread's recent samples, for the current rate
  size_t last_width_ = 0;       // of the last terminal line: a shorter one pads over it
  bool finished_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

/// 950 -> "950", 12345 -> "12.3k", 2.5e6 -> "2.50M" (rates and counts on a progress line).
std::string format_count(double v);
/// Seconds -> "4.2s", "3:08", "1:02:03".
std::string format_duration(double secs);

}  // namespace dmhnsw
