#pragma once
// Real processes for integration tests: spawn, wait with a deadline, kill; memnodes started
// on a free port with their address read from --ready-file. No sleeps to wait for peers:
// readiness is a file the memnode writes once it serves.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../sanitizer_reports.hpp"

namespace dmhnsw::testing {

inline std::string bin(const std::string& name) { return std::string(DMHNSW_BIN_DIR) + "/" + name; }

/// `computenode --mode MODE --provider P --memnodes M --cn-id ID --num-cns K REST...`
inline std::vector<std::string> computenode_args(const std::string& mode, const std::string& provider,
                                                 const std::string& memnodes, int id, int k,
                                                 const std::vector<std::string>& rest) {
  std::vector<std::string> a{bin("computenode"), "--mode", mode, "--provider", provider, "--memnodes", memnodes,
                             "--cn-id", std::to_string(id), "--num-cns", std::to_string(k)};
  a.insert(a.end(), rest.begin(), rest.end());
  return a;
}

/// A JSON file (a report); throws naming the file when it is missing or malformed.
inline nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return nlohmann::json::parse(in);
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A scratch directory removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/dmhnsw-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

class Proc {
 public:
  /// Starts argv[0] with the arguments; stdout and stderr go to `log`.
  Proc(std::vector<std::string> argv, std::string log, std::vector<std::string> env = {})
      : log_(std::move(log)), argv_(argv) {
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      // A test process that dies (a failed REQUIRE's abort, SIGPIPE, Ctrl-C) takes its
      // memnodes and computenodes with it instead of leaving them serving for ever.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      for (auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> a;
      for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      ::execvp(a[0], a.data());
      std::perror("execvp");
      ::_exit(127);
    }
  }
  Proc(const Proc&) = delete;
  /// A process still running is asked to stop (SIGTERM) and killed if it has not within 6 s
  /// (a memnode stuck in its provider takes 5). A process that stops cleanly closes its
  /// fabric: libfabric's shm provider then removes its /dev/shm files, which a killed one
  /// leaves behind (16 MiB each).
  ~Proc() {
    if (!running()) return;
    ::kill(pid_, SIGTERM);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(6);
    while (running() && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (running()) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      remove_shm_files();
    }
  }
  bool running() {
    if (done_) return false;
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      done_ = true;
      code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (WIFSIGNALED(st)) remove_shm_files();
      sanitizer_reports::collect_child_output(output(), argv_[0]);
    }
    return !done_;
  }
  /// Exit code, or -1 when still running after `timeout` (then it is killed).
  int wait(std::chrono::milliseconds timeout) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (running()) {
      if (std::chrono::steady_clock::now() > end) {
        append_stacks();
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        remove_shm_files();
        done_ = true;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a child, not a peer
    }
    return code_;
  }
  void signal(int sig) { ::kill(pid_, sig); }
  std::string output() const { return slurp(log_); }
  pid_t pid() const { return pid_; }

 private:
  /// Every thread's stack of a process that missed its deadline, appended to its log (which the
  /// test prints): a hang seen once on a loaded CI host can then be read, not guessed.
  void append_stacks() const {
    if (::access("/usr/bin/gdb", X_OK) != 0) return;
    const std::string cmd = "echo '--- stacks at the deadline (gdb) ---' >> '" + log_ +
                            "'; timeout 30 /usr/bin/gdb -p " + std::to_string(pid_) +
                            " -batch -nx -ex 'thread apply all bt' >> '" + log_ + "' 2>&1";
    [[maybe_unused]] int rc = std::system(cmd.c_str());
  }
  /// The /dev/shm files of libfabric's shm provider (`<pid>:<n>:<m>`) that this process, reaped
  /// after a signal killed it, left behind (docs/operations.md): tests kill memnodes on purpose.
  void remove_shm_files() const {
    const std::string prefix = std::to_string(pid_) + ":";
    std::error_code ec;
    std::vector<std::filesystem::path> mine;
    for (auto it = std::filesystem::directory_iterator("/dev/shm", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
      if (it->path().filename().string().rfind(prefix, 0) == 0) mine.push_back(it->path());
    for (const auto& f : mine) std::filesystem::remove(f, ec);
  }

  std::string log_;
  std::vector<std::string> argv_;
  pid_t pid_ = -1;
  bool done_ = false;
  int code_ = -1;
};

/// SIGKILLs `victim`, then waits up to `limit` for `p` to end by itself: its exit code (-1: still
/// running at the limit, then killed) and the seconds from the kill to its end.
struct TimedExit {
  int code;
  double secs;
};
inline TimedExit kill_then_wait(Proc& victim, Proc& p, std::chrono::seconds limit) {
  victim.signal(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  const int code = p.wait(limit);
  return {code, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

/// A memnode on a free port. `prefix` runs it inside something (e.g. "ip netns exec NS").
struct Memnode {
  std::unique_ptr<Proc> proc;
  std::string address;
  Memnode(const TempDir& dir, int id, const std::string& provider, const std::string& listen = "127.0.0.1:0",
          std::vector<std::string> extra = {}, std::vector<std::string> prefix = {},
          std::vector<std::string> env = {}) {
    std::string ready = dir.file("memnode" + std::to_string(id) + ".ready");
    std::filesystem::remove(ready);  // a memnode started earlier in this directory left one
    std::vector<std::string> argv = prefix;
    for (auto s : {bin("memnode"), std::string("--listen"), listen, std::string("--id"), std::to_string(id),
                   std::string("--provider"), provider, std::string("--region"), std::string("128MiB"),
                   std::string("--ready-file"), ready, std::string("--store-dir"), dir.file("")})
      argv.push_back(s);  // store requests may write inside the test's directory
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc = std::make_unique<Proc>(argv, dir.file("memnode" + std::to_string(id) + ".log"), env);
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!std::filesystem::exists(ready)) {
      if (!proc->running())
        throw std::runtime_error("memnode " + std::to_string(id) + " exited at start: " + proc->output());
      if (std::chrono::steady_clock::now() > end)
        throw std::runtime_error("memnode " + std::to_string(id) + " not ready in 20 s: " + proc->output());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::ifstream(ready) >> address;
  }
};

struct RunResult {
  int code;
  std::string output;
};

inline RunResult run(std::vector<std::string> argv, const TempDir& dir, const std::string& name,
                     std::chrono::milliseconds timeout = std::chrono::seconds(120),
                     std::vector<std::string> env = {}) {
  Proc p(std::move(argv), dir.file(name + ".log"), env);
  int code = p.wait(timeout);
  return {code, p.output()};
}

/// A small synthetic set (`n` x 24, 16 clusters), its exact ground truth and a uniform
/// workload of `measured` queries after 50 warm-up ones, generated by the real tools.
struct SmallData {
  TempDir dir;
  std::string base, queries, gt, wl;
  explicit SmallData(uint64_t measured = 400, uint64_t n = 3000) {
    base = dir.file("base.fvecs");
    queries = dir.file("queries.fvecs");
    gt = dir.file("gt.ivecs");
    wl = dir.file("q.wl");
    auto ok = [&](std::vector<std::string> argv, const char* name) {
      auto r = run(std::move(argv), dir, name, std::chrono::seconds(120));
      if (r.code != 0) throw std::runtime_error(std::string(name) + " failed:\n" + r.output);
    };
    ok({bin("datagen"), "--n", std::to_string(n), "--d", "24", "--clusters", "16", "--spread", "0.5", "--seed", "3", "--queries",
        "200", "--out-base", base, "--out-queries", queries},
       "datagen");
    ok({bin("groundtruth"), "--base", base, "--queries", queries, "--k", "10", "--metric", "l2", "--out", gt},
       "groundtruth");
    ok({bin("workload"), "--queries", queries, "--groundtruth", gt, "--dist", "uniform", "--count",
        std::to_string(measured), "--warmup", "50", "--seed", "1", "--out", wl},
       "workload");
  }
};

/// Rows [begin, end) of an .fvecs file as a new .fvecs file.
inline void copy_rows(const std::string& from, const std::string& to, int begin, int end, int dim) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary);
  const size_t row = 4 + 4 * static_cast<size_t>(dim);
  std::vector<char> buf(row);
  in.seekg(static_cast<std::streamoff>(row) * begin);
  for (int i = begin; i < end; ++i) {
    in.read(buf.data(), static_cast<std::streamsize>(row));
    out.write(buf.data(), static_cast<std::streamsize>(row));
  }
  if (!in || !out) throw std::runtime_error("copy_rows " + from + " -> " + to + " failed");
}

/// The first `n` rows of a real data set in ../shared/data as .fvecs (bigann10k: 128-d SIFT
/// bytes, l2; wordnet: 384-d sentence embeddings, ip), up to 300 of its queries (bigann10k has
/// 100) with their exact top-10 over those rows (groundtruth), and a workload drawn from them
/// (50 warm-up, 300 measured).
struct RealSubset {
  TempDir dir;
  std::string base, queries, gt, wl, metric;
  int dim = 0;
  RealSubset(const std::string& set, int n) {
    const std::string root = std::string(DMHNSW_SHARED_DATA) + "/";
    std::string from_base, from_queries;
    bool bytes = false;
    if (set == "bigann10k") {
      from_base = root + "bigann10k/bigann10k_base.bvecs", from_queries = root + "bigann10k/bigann10k_query.fvecs";
      metric = "l2", bytes = true;
    } else {
      from_base = root + "wordnet-minilm-384/base.fvecs", from_queries = root + "wordnet-minilm-384/query.fvecs";
      metric = "ip";
    }
    base = dir.file("base.fvecs"), queries = dir.file("queries.fvecs"), gt = dir.file("gt.ivecs"), wl = dir.file("q.wl");
    // .bvecs or .fvecs rows [0, rows) of `from` into .fvecs `to`
    // (at most: a query file may hold fewer; the workload draws its 300 from them)
    auto rows_to_fvecs = [&](const std::string& from, const std::string& to, int rows, bool u8) {
      std::ifstream in(from, std::ios::binary);
      std::ofstream out(to, std::ios::binary);
      for (int i = 0; i < rows; ++i) {
        int32_t d = 0;
        in.read(reinterpret_cast<char*>(&d), 4);
        if (!in && i > 0 && in.eof()) return;
        if (!in || d <= 0 || d > 4096) throw std::runtime_error("RealSubset: " + from + ": bad row " + std::to_string(i));
        dim = d;
        std::vector<float> v(static_cast<size_t>(d));
        if (u8) {
          std::vector<unsigned char> b(static_cast<size_t>(d));
          in.read(reinterpret_cast<char*>(b.data()), d);
          for (int j = 0; j < d; ++j) v[static_cast<size_t>(j)] = b[static_cast<size_t>(j)];
        } else {
          in.read(reinterpret_cast<char*>(v.data()), 4 * static_cast<std::streamsize>(d));
        }
        out.write(reinterpret_cast<const char*>(&d), 4);
        out.write(reinterpret_cast<const char*>(v.data()), 4 * static_cast<std::streamsize>(d));
      }
      if (!in || !out) throw std::runtime_error("RealSubset: " + from + " -> " + to + " failed");
    };
    rows_to_fvecs(from_base, base, n, bytes);
    rows_to_fvecs(from_queries, queries, 300, false);
    for (auto argv : std::vector<std::vector<std::string>>{
             {bin("groundtruth"), "--base", base, "--queries", queries, "--k", "10", "--metric", metric, "--out", gt},
             {bin("workload"), "--queries", queries, "--groundtruth", gt, "--dist", "uniform", "--count", "300",
              "--warmup", "50", "--seed", "1", "--out", wl}}) {
      auto r = run(argv, dir, "real-subset", std::chrono::seconds(120));
      if (r.code != 0) throw std::runtime_error("RealSubset " + set + ": " + r.output);
    }
  }
};

/// A workload whose queries are rows [begin, end) of the base and whose ground truth is over
/// the whole base: each query's nearest neighbour is itself.
inline std::string self_workload(const SmallData& d, const TempDir& dir, int begin, int end) {
  const std::string q = dir.file("self.fvecs"), gt = dir.file("self.ivecs"), wl = dir.file("self.wl");
  copy_rows(d.base, q, begin, end, 24);
  for (auto argv : std::vector<std::vector<std::string>>{
           {bin("groundtruth"), "--base", d.base, "--queries", q, "--k", "10", "--metric", "l2", "--out", gt},
           {bin("workload"), "--queries", q, "--groundtruth", gt, "--dist", "uniform", "--count",
            std::to_string(end - begin), "--warmup", "0", "--seed", "1", "--out", wl}}) {
    auto r = run(argv, dir, "self-workload", std::chrono::seconds(120));
    if (r.code != 0) throw std::runtime_error("self workload: " + r.output);
  }
  return wl;
}

/// A shine index over `d` in the memnodes `mns`, built by hnswlib on this host and written by
/// shine-import (about a second), for tests that serve or query an index rather than build one:
/// a shine build of the same 3,000 vectors over tcp takes ~14 s of remote operations.
inline void import_shine_index(const TempDir& dir, const std::string& provider, const std::string& mns,
                               const SmallData& d, const std::vector<std::string>& env = {},
                               const std::vector<std::string>& import_flags = {}) {
  const std::string idx = dir.file("import.hnsw");
  auto h = run({bin("hnswlib-bench"), "--base", d.base, "--workload", d.wl, "--ef-search", "32", "--m", "16",
                "--ef-construction", "80", "--threads", "1", "--save", idx},
               dir, "hnswlib-build", std::chrono::seconds(120), env);
  if (h.code != 0) throw std::runtime_error("hnswlib-bench failed:\n" + h.output);
  std::vector<std::string> args{bin("shine-import"), "--hnswlib", idx, "--data", d.base, "--provider", provider,
                                "--memnodes", mns};
  args.insert(args.end(), import_flags.begin(), import_flags.end());
  auto i = run(args, dir, "shine-import", std::chrono::seconds(120), env);
  if (i.code != 0) throw std::runtime_error("shine-import failed:\n" + i.output);
}

/// Waits until `p`'s output contains `text` (false after `timeout` or when `p` exited).
inline bool wait_for_output(Proc& p, const std::string& text, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (p.output().find(text) != std::string::npos) return true;
    if (!p.running()) return p.output().find(text) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a child's log
  }
  return false;
}

}  // namespace dmhnsw::testing
