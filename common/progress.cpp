#include "common/progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace dmhnsw {

namespace {

using std::chrono::milliseconds;

constexpr milliseconds kTerminalPeriod{200};
constexpr milliseconds kPlainPeriod{10000};
// The rate shown is over about this much recent time: it follows a build that slows down as
// its graph grows, where the mean since the start would promise too early an end.
constexpr std::chrono::seconds kRateWindow{10};
constexpr size_t kMaxBar = 30;

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

bool is_terminal(std::FILE* f) {
  const int fd = ::fileno(f);
  if (fd < 0 || ::isatty(fd) == 0) return false;
  const char* term = std::getenv("TERM");
  return term != nullptr && *term != '\0' && std::strcmp(term, "dumb") != 0;
}

/// DMHNSW_PROGRESS_SECONDS, or the default (with a word on stderr) if it is not a positive number.
milliseconds plain_period() {
  const char* v = std::getenv("DMHNSW_PROGRESS_SECONDS");
  if (v == nullptr || *v == '\0') return kPlainPeriod;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(s) || s <= 0 || s > 1e6) {
    std::fprintf(stderr, "DMHNSW_PROGRESS_SECONDS=%s: not a positive number of seconds; using %lld\n", v,
                 static_cast<long long>(kPlainPeriod.count() / 1000));
    return kPlainPeriod;
  }
  return milliseconds(std::max<long long>(1, std::llround(s * 1000)));
}

size_t terminal_columns(std::FILE* f) {
  winsize ws{};
  if (::ioctl(::fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20) return ws.ws_col;
  return 80;
}

std::string percent(uint64_t d, uint64_t total) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * static_cast<double>(d) / static_cast<double>(total));
  return buf;
}

std::string eta(uint64_t d, uint64_t total, double rate) {
  if (d >= total) return format_duration(0);
  if (rate <= 0) return "?";
  return format_duration(static_cast<double>(total - d) / rate);
}

}  // namespace

std::string format_count(double v) {
  char buf[32];
  if (!std::isfinite(v) || v < 0) return "?";
  if (v < 10 && v != std::floor(v)) std::snprintf(buf, sizeof buf, "%.1f", v);
  else if (v < 1e3) std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (v < 1e6) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else if (v < 1e9) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  return buf;
}

std::string format_duration(double secs) {
  if (!std::isfinite(secs) || secs < 0) return "?";
  char buf[48];
  if (secs < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", secs);
    return buf;
  }
  const auto s = static_cast<long long>(std::llround(secs));
  if (s < 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

Progress::Progress(std::string label, uint64_t total, std::string unit, ProgressOptions o)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), out_(o.out), t0_(Clock::now()) {
  enabled_ = o.enabled && out_ != nullptr && !env_is("DMHNSW_PROGRESS", "0");
  if (!enabled_) return;
  terminal_ = o.terminal.value_or(is_terminal(out_));
  period_ = o.period.value_or(terminal_ ? kTerminalPeriod : plain_period());
  period_ = std::max(period_, milliseconds(1));
  window_.push_back({t0_, 0});
  thread_ = std::thread([this] { run(); });
}

Progress::~Progress() {
  if (finished_) return;
  stop_thread();
  if (terminal_ && last_width_ > 0) write("\n");  // later output starts on a line of its own
}

void Progress::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
    lock.unlock();  // add() never takes the lock, but finish() must not wait on a slow write
    draw();
    lock.lock();
  }
}

void Progress::stop_thread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Progress::draw() {
  const auto now = Clock::now();
  const uint64_t d = done();
  window_.push_back({now, d});
  while (window_.size() > 2 && now - window_[1].t >= kRateWindow) window_.pop_front();
  const Sample& from = window_.front();
  const double span = std::chrono::duration<double>(now - from.t).count();
  const double rate = span > 0 && d >= from.done ? static_cast<double>(d - from.done) / span : 0;
  if (!terminal_) {
    write(plain_line(d, std::chrono::duration<double>(now - t0_).count(), rate));
    return;
  }
  std::string line = terminal_line(d, rate);
  const size_t width = line.size();
  if (width < last_width_) line.append(last_width_ - width, ' ');  // cover the longer last line
  last_width_ = width;
  write("\r" + line);
}

std::string Progress::plain_line(uint64_t d, double secs, double rate) const {
  std::string s = label_ + ": " + std::to_string(d);
  if (total_ > 0) s += "/" + std::to_string(total_);
  s += " " + unit_;
  if (total_ > 0) s += " (" + percent(d, total_) + ")";
  s += ", " + format_count(rate) + " " + unit_ + "/s, " + format_duration(secs) + " elapsed";
  if (total_ > 0) s += ", ETA " + eta(d, total_, rate);
  return s + "\n";
}

std::string Progress::terminal_line(uint64_t d, double rate) const {
  std::string tail = " " + std::to_string(d);
  if (total_ > 0) tail += "/" + std::to_string(total_) + " " + percent(d, total_);
  tail += " " + format_count(rate) + " " + unit_ + "/s";
  if (total_ > 0) tail += " ETA " + eta(d, total_, rate);
  // One column short of the width: a line that fills it wraps on some terminals, and every
  // redraw would then start a new line.
  const size_t cols = terminal_columns(out_) - 1;
  std::string line = label_;
  const size_t used = label_.size() + tail.size() + 3;  // " [" and "]"
  if (total_ > 0 && used + 5 <= cols) {
    const size_t w = std::min(kMaxBar, cols - used);
    const double frac = std::min(1.0, static_cast<double>(d) / static_cast<double>(total_));
    const auto filled = static_cast<size_t>(frac * static_cast<double>(w));
    line += " [" + std::string(filled, '#') + std::string(w - filled, '-') + "]";
  }
  line += tail;
  if (line.size() > cols) line.resize(cols);
  return line;
}

void Progress::write(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), out_);
  std::fflush(out_);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  stop_thread();
  if (!enabled_) return;
  const double secs = std::chrono::duration<double>(Clock::now() - t0_).count();
  const uint64_t d = done();
  std::string line = label_ + ": " + std::to_string(d);
  if (total_ > 0 && d != total_) line += " of " + std::to_string(total_);
  line += " " + unit_ + " in " + format_duration(secs) + " (" +
          format_count(secs > 0 ? static_cast<double>(d) / secs : 0) + " " + unit_ + "/s)";
  if (terminal_) {
    if (line.size() < last_width_) line.append(last_width_ - line.size(), ' ');
    line = "\r" + line;
  }
  write(line + "\n");
}

}  // namespace dmhnsw
