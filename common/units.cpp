#include "common/units.hpp"

#include <cctype>
#include <cstdio>
#include <stdexcept>

namespace dmhnsw {

uint64_t parse_bytes(const std::string& s, const std::string& flag) {
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0) throw std::invalid_argument(flag + ": expected a size like 512MiB or 4GiB, got '" + s + "'");
  uint64_t v = std::stoull(s.substr(0, i));
  std::string unit;
  for (size_t j = i; j < s.size(); ++j)
    if (s[j] != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(s[j])));
  unsigned shift;
  if (unit.empty() || unit == "b") shift = 0;
  else if (unit == "k" || unit == "kib" || unit == "kb") shift = 10;
  else if (unit == "m" || unit == "mib" || unit == "mb") shift = 20;
  else if (unit == "g" || unit == "gib" || unit == "gb") shift = 30;
  else if (unit == "t" || unit == "tib" || unit == "tb") shift = 40;
  else throw std::invalid_argument(flag + ": unknown unit '" + unit + "' in '" + s + "' (use B, KiB, MiB, GiB, TiB)");
  if (shift > 0 && v > (~uint64_t{0} >> shift)) throw std::invalid_argument(flag + ": size '" + s + "' is too large");
  return v << shift;
}

std::string format_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  else std::snprintf(buf, sizeof buf, "%.4g %s", v, units[u]);
  return buf;
}

}  // namespace dmhnsw

namespace dmhnsw {
std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}
}  // namespace dmhnsw
