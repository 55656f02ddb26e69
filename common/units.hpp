#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dmhnsw {
/// "64GiB", "512 MiB", "4k", "1048576" → bytes (binary units). Throws naming `flag`.
uint64_t parse_bytes(const std::string& s, const std::string& flag);
/// 1536 → "1.5 KiB".
std::string format_bytes(uint64_t n);
/// "a,b,,c" → {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split_commas(const std::string& s);
}  // namespace dmhnsw
