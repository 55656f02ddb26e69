#pragma once
// Metrics of `computenode serve` in the Prometheus text exposition format (version 0.0.4),
// served over HTTP by cpp-httplib on --metrics-listen. Debian has no C++ Prometheus client;
// this is the small part of one the service needs: counters, gauges and histograms with
// labels, updated lock-free on the hot path, rendered on each scrape.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace httplib {
class Server;
}

namespace dmhnsw::serve {

/// A monotonically increasing count.
class Counter {
 public:
  void add(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

/// A value that goes up and down.
class Gauge {
 public:
  void set(double v) { v_.store(v, std::memory_order_relaxed); }
  void add(double d);
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

/// Observations counted into fixed upper bounds (cumulative on rendering).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  /// Per-bucket counts (not cumulative), the +Inf bucket last; the sum and count.
  void snapshot(std::vector<uint64_t>& buckets, double& sum, uint64_t& count) const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1
  Gauge sum_;
  std::atomic<uint64_t> count_{0};
};

/// Latency buckets in seconds: 50 µs .. 10 s.
std::vector<double> latency_buckets();
/// Powers of two from 1 to `max`.
std::vector<double> size_buckets(double max);

/// Labels as name=value pairs, in the order given.
using Labels = std::vector<std::pair<std::string, std::string>>;

/// Every metric of the process, by name and label set. Getting a metric takes a lock; keep
/// the reference for the hot path. References stay valid for the registry's lifetime.
class Registry {
 public:
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                       const Labels& labels = {});
  /// The text exposition of every metric, families sorted by name.
  std::string render() const;

 private:
  enum class Type { Counter, Gauge, Histogram };
  struct Family {
    Type type;
    std::string help;
    std::map<std::string, std::unique_ptr<Counter>> counters;  // by rendered label set
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };
  Family& family(const std::string& name, Type t, const std::string& help);
  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

/// `{a="x",b="y"}` with Prometheus' escaping, or "" for no labels.
std::string render_labels(const Labels& labels);

/// GET /metrics on HOST:PORT (port 0: any free port). With a token, a scrape must carry
/// `Authorization: Bearer TOKEN` (Prometheus' bearer_token); anything else is refused with 401.
class MetricsServer {
 public:
  /// Binds at once (throws naming the address when it cannot) and serves on a thread of its own.
  MetricsServer(const Registry& r, const std::string& host, int port, std::string token);
  ~MetricsServer();
  int port() const { return port_; }

 private:
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace dmhnsw::serve
