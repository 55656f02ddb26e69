#include "compute/serve/metrics.hpp"

#include <httplib.h>
#include <openssl/crypto.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace dmhnsw::serve {

void Gauge::add(double d) {
  double cur = v_.load(std::memory_order_relaxed);
  while (!v_.compare_exchange_weak(cur, cur + d, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.add(v);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Histogram::snapshot(std::vector<uint64_t>& buckets, double& sum, uint64_t& count) const {
  buckets.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets[i] = counts_[i].load(std::memory_order_relaxed);
  sum = sum_.value();
  count = count_.load(std::memory_order_relaxed);
}

std::vector<double> latency_buckets() {
  return {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10};
}

std::vector<double> size_buckets(double max) {
  std::vector<double> b;
  for (double v = 1; v <= max; v *= 2) b.push_back(v);
  return b;
}

namespace {

std::string escape(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (quote && c == '"') out += "\\\"";
    else out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

/// `labels` (rendered, "{...}" or "") with one more pair appended.
std::string with_label(const std::string& labels, const std::string& name, const std::string& value) {
  const std::string pair = name + "=\"" + escape(value, true) + "\"";
  if (labels.empty()) return "{" + pair + "}";
  return labels.substr(0, labels.size() - 1) + "," + pair + "}";
}

}  // namespace

std::string render_labels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string s = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) s += ",";
    s += labels[i].first + "=\"" + escape(labels[i].second, true) + "\"";
  }
  return s + "}";
}

Registry::Family& Registry::family(const std::string& name, Type t, const std::string& help) {
  auto [it, fresh] = families_.try_emplace(name);
  if (fresh) {
    it->second.type = t;
    it->second.help = help;
  } else if (it->second.type != t) {
    throw std::logic_error("metric " + name + " registered with two types");
  }
  return it->second;
}

Counter& Registry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard g(mu_);
  auto& slot = family(name, Type::Counter, help).counters[render_labels(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard g(mu_);
  auto& slot = family(name, Type::Gauge, help).gauges[render_labels(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                               const Labels& labels) {
  std::lock_guard g(mu_);
  auto& slot = family(name, Type::Histogram, help).histograms[render_labels(labels)];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return *slot;
}

std::string Registry::render() const {
  std::lock_guard g(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " " + escape(f.help, false) + "\n";
    out += "# TYPE " + name + (f.type == Type::Counter ? " counter\n" : f.type == Type::Gauge ? " gauge\n" : " histogram\n");
    for (const auto& [l, c] : f.counters) out += name + l + " " + std::to_string(c->value()) + "\n";
    for (const auto& [l, v] : f.gauges) out += name + l + " " + number(v->value()) + "\n";
    for (const auto& [l, h] : f.histograms) {
      std::vector<uint64_t> b;
      double sum = 0;
      uint64_t count = 0;
      h->snapshot(b, sum, count);
      uint64_t cum = 0;
      for (size_t i = 0; i < b.size(); ++i) {
        cum += b[i];
        const double le = i < h->bounds().size() ? h->bounds()[i] : INFINITY;
        out += name + "_bucket" + with_label(l, "le", number(le)) + " " + std::to_string(cum) + "\n";
      }
      out += name + "_sum" + l + " " + number(sum) + "\n";
      out += name + "_count" + l + " " + std::to_string(count) + "\n";
    }
  }
  return out;
}

MetricsServer::MetricsServer(const Registry& r, const std::string& host, int port, std::string token)
    : http_(std::make_unique<httplib::Server>()) {
  http_->set_read_timeout(5, 0);  // a slow scraper holds one of httplib's threads for at most this
  http_->set_write_timeout(5, 0);
  http_->Get("/metrics", [&r, token](const httplib::Request& req, httplib::Response& res) {
    if (!token.empty()) {
      const std::string want = "Bearer " + token;
      const std::string got = req.get_header_value("Authorization");
      if (got.size() != want.size() || CRYPTO_memcmp(got.data(), want.data(), got.size()) != 0) {
        res.status = 401;
        res.set_header("WWW-Authenticate", "Bearer");
        res.set_content("the cluster token is needed: Authorization: Bearer TOKEN\n", "text/plain");
        return;
      }
    }
    res.set_content(r.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  port_ = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0)
    throw std::runtime_error("--metrics-listen " + host + ":" + std::to_string(port) + ": cannot listen there");
  thread_ = std::thread([this] { http_->listen_after_bind(); });
}

MetricsServer::~MetricsServer() {
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace dmhnsw::serve
