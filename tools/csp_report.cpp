// csp-report: cache hit rates and the cache segmentation penalty of SHINE runs, from the access
// traces the computenodes wrote (cache/trace.hpp). Each DIR holds the *.trace files of one run;
// the report replays them into one shared cache of the summed capacity (CHR_max) and compares
// with the hit rate the computenodes' own caches achieved (CHR): CSP = 1 - CHR / CHR_max.
//
//   csp-report DIR... [--json FILE] [--png FILE] [--x num_cns|label]
//
// --png runs csp_plot.py (installed next to this binary) with a Python 3 that has matplotlib.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/version.hpp"
#include "cache/trace.hpp"
#include "common/json_file.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using dmhnsw::cache::CspResult;
using dmhnsw::cache::TraceFile;

struct Run {
  std::string dir, label;
  std::vector<std::string> files;
  uint64_t records = 0;
  CspResult result;
};

std::string label_of(const TraceFile& f) {
  return std::string(f.meta.label, strnlen(f.meta.label, sizeof f.meta.label));
}

Run load_run(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw std::runtime_error(dir + ": not a directory");
  Run run;
  run.dir = dir;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".trace") run.files.push_back(e.path().string());
  }
  std::sort(run.files.begin(), run.files.end());
  if (run.files.empty()) throw std::runtime_error(dir + ": no *.trace files");
  std::vector<TraceFile> traces;
  traces.reserve(run.files.size());
  for (const std::string& p : run.files) {
    traces.push_back(dmhnsw::cache::read_trace(p));
    run.records += traces.back().records.size();
  }
  run.label = label_of(traces.front());
  if (run.label.empty()) run.label = fs::path(dir).lexically_normal().filename().string();
  if (run.label.empty()) run.label = dir;
  run.result = dmhnsw::cache::replay(traces);
  return run;
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4f", v);
  return b;
}

std::string bytes_text(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char s[32];
  if (u == 0)
    std::snprintf(s, sizeof s, "%llu B", static_cast<unsigned long long>(b));
  else
    std::snprintf(s, sizeof s, "%.1f %s", v, units[u]);
  return s;
}

void print_run(std::size_t i, const Run& run) {
  const CspResult& r = run.result;
  std::printf("run %zu: %s  (label %s, %u computenodes, %zu trace files, %llu records)\n", i + 1, run.dir.c_str(),
              run.label.c_str(), r.num_cns, run.files.size(), static_cast<unsigned long long>(run.records));
  if (r.per_cn.size() != r.num_cns)
    std::printf("  warning: traces of %zu of %u computenodes\n", r.per_cn.size(), r.num_cns);
  std::printf("  %4s %12s %12s %8s %12s\n", "cn", "accesses", "hits", "CHR", "cache");
  for (const auto& pc : r.per_cn)
    std::printf("  %4u %12llu %12llu %8s %12s\n", pc.cn_id, static_cast<unsigned long long>(pc.accesses),
                static_cast<unsigned long long>(pc.hits), fmt(pc.chr()).c_str(), bytes_text(pc.capacity_bytes).c_str());
  std::printf("  aggregate CHR %s   CHR_max %s (one shared cache of %s: %llu of %llu hits)   CSP %s\n\n",
              fmt(r.chr()).c_str(), fmt(r.chr_max()).c_str(), bytes_text(r.shared_capacity_bytes).c_str(),
              static_cast<unsigned long long>(r.shared_hits), static_cast<unsigned long long>(r.shared_accesses),
              fmt(r.csp()).c_str());
}

void print_table(const std::vector<Run>& runs) {
  std::printf("%4s %-16s %5s %8s %8s %8s  %s\n", "run", "label", "cns", "CHR", "CHR_max", "CSP", "dir");
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const CspResult& r = runs[i].result;
    std::printf("%4zu %-16s %5u %8s %8s %8s  %s\n", i + 1, runs[i].label.c_str(), r.num_cns, fmt(r.chr()).c_str(),
                fmt(r.chr_max()).c_str(), fmt(r.csp()).c_str(), runs[i].dir.c_str());
  }
}

nlohmann::json to_json(const std::vector<Run>& runs, const std::string& x) {
  nlohmann::json j;
  j["x"] = x;
  j["runs"] = nlohmann::json::array();
  for (const Run& run : runs) {
    const CspResult& r = run.result;
    nlohmann::json per = nlohmann::json::array();
    for (const auto& pc : r.per_cn)
      per.push_back({{"cn_id", pc.cn_id},
                     {"accesses", pc.accesses},
                     {"hits", pc.hits},
                     {"chr", pc.chr()},
                     {"capacity_bytes", pc.capacity_bytes}});
    j["runs"].push_back({{"dir", run.dir},
                         {"label", run.label},
                         {"files", run.files},
                         {"records", run.records},
                         {"num_cns", r.num_cns},
                         {"per_cn", per},
                         {"accesses", r.accesses},
                         {"hits", r.hits},
                         {"chr", r.chr()},
                         {"shared_capacity_bytes", r.shared_capacity_bytes},
                         {"shared_accesses", r.shared_accesses},
                         {"shared_hits", r.shared_hits},
                         {"chr_max", r.chr_max()},
                         {"csp", r.csp()}});
  }
  return j;
}

void write_json(const std::string& path, const nlohmann::json& j) { dmhnsw::write_json_file(path, j, "--json"); }

// Runs argv without a shell; returns the exit code (127 if it cannot be started).
int run(const std::vector<std::string>& args, bool quiet) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return 127;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

fs::path self_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : exe.parent_path();
}

// The Python 3 to plot with: $DMHNSW_PYTHON when set (only that one), else the first of Debian's
// /usr/bin/python3 (where python3-matplotlib installs) and python3 on PATH that has matplotlib.
std::string find_python(std::vector<std::string>& tried) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("DMHNSW_PYTHON"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  } else {
    candidates.push_back("/usr/bin/python3");
    candidates.push_back("python3");
  }
  for (const std::string& py : candidates) {
    tried.push_back(py);
    if (run({py, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('matplotlib') is None)"}, true) == 0)
      return py;
  }
  return {};
}

void make_png(const nlohmann::json& j, const std::string& png, const std::string& x) {
  const fs::path script = self_dir() / "csp_plot.py";
  if (!fs::exists(script))
    throw std::runtime_error("--png: plot script " + script.string() + " is missing (it is installed next to csp-report by the build)");
  std::vector<std::string> tried;
  const std::string py = find_python(tried);
  if (py.empty()) {
    std::string list;
    for (const std::string& t : tried) list += (list.empty() ? "" : ", ") + t;
    throw std::runtime_error("--png needs Python 3 with matplotlib (Debian package python3-matplotlib; run "
                             "tools/install-deps.sh); none of these imports it: " + list +
                             " (set DMHNSW_PYTHON to choose an interpreter)");
  }
  char tmpl[] = "/tmp/csp-report-XXXXXX.json";
  const int fd = mkstemps(tmpl, 5);
  if (fd < 0) throw std::runtime_error(std::string("--png: cannot create a temporary file: ") + std::strerror(errno));
  close(fd);
  const std::string tmp = tmpl;
  int rc = 0;
  try {
    write_json(tmp, j);
    rc = run({py, script.string(), "--json", tmp, "--png", png, "--x", x}, false);
  } catch (...) {
    fs::remove(tmp);
    throw;
  }
  fs::remove(tmp);
  if (rc != 0) throw std::runtime_error("--png: " + py + " " + script.string() + " failed (exit code " + std::to_string(rc) + ")");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"csp-report: per-computenode cache hit rate (CHR), the shared-cache hit rate (CHR_max) and the cache "
               "segmentation penalty CSP = 1 - CHR / CHR_max of runs, from their access traces"};
  app.set_version_flag("--version", dmhnsw::version_line("csp-report"));
  std::vector<std::string> dirs;
  std::string json_path, png_path, x = "num_cns";
  app.add_option("dirs", dirs, "one directory per run, holding the *.trace files of all its computenodes")->required();
  app.add_option("--json", json_path, "write every number to this JSON file");
  app.add_option("--png", png_path, "plot CSP and CHR against --x (needs python3 with matplotlib)");
  app.add_option("--x", x, "x axis of the plot")->capture_default_str()->check(CLI::IsMember({"num_cns", "label"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    std::vector<Run> runs;
    for (const std::string& d : dirs) runs.push_back(load_run(d));
    for (std::size_t i = 0; i < runs.size(); ++i) print_run(i, runs[i]);
    print_table(runs);
    std::fflush(stdout);
    const nlohmann::json j = to_json(runs, x);
    if (!json_path.empty()) write_json(json_path, j);
    if (!png_path.empty()) {
      make_png(j, png_path, x);
      std::printf("plot: %s\n", png_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "csp-report: %s\n", e.what());
    return 1;
  }
  return 0;
}
