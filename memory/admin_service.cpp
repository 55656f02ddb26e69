#include "memory/admin_service.hpp"

#include <sys/resource.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>

#include "common/units.hpp"
#include "memory/admin.hpp"
#include "memory/image.hpp"

namespace dmhnsw::memory {

namespace {

template <class T>
std::vector<char> bytes_of(const T& v) {
  std::vector<char> out(sizeof v);
  std::memcpy(out.data(), &v, sizeof v);
  return out;
}

/// Where a store request for `dir` may write: inside `root` (the memnode's --store-dir), after
/// resolving "..", symbolic links of existing parts and, for a relative `dir`, `root` itself.
std::filesystem::path store_target(const std::string& dir, const std::string& root) {
  if (root.empty())
    throw std::runtime_error("this memnode takes no store requests (start it with --store-dir DIR to allow them)");
  const std::filesystem::path r = std::filesystem::weakly_canonical(std::filesystem::absolute(root));
  std::filesystem::path d(dir);
  d = std::filesystem::weakly_canonical(d.is_absolute() ? d : r / d);
  const std::filesystem::path rel = d.lexically_relative(r);
  if (rel.empty() || *rel.begin() == "..")
    throw std::runtime_error("directory '" + dir + "' is outside this memnode's --store-dir " + r.string());
  return d;
}

admin::StoreReply store(const admin::StoreRequest& req, const char* region, uint64_t region_size,
                        uint16_t memnode_id, const std::string& store_dir) {
  admin::StoreReply rep{};
  rep.type = static_cast<uint32_t>(admin::MsgType::StoreReply);
  rep.memnode_id = memnode_id;
  rep.request_id = req.request_id;
  std::string dir = admin::get_text(req.dir, sizeof req.dir, req.dir_len);
  try {
    if (dir.empty()) throw std::runtime_error("store request with an empty directory");
    std::filesystem::path d = store_target(dir, store_dir);
    std::error_code ec;
    std::filesystem::create_directories(d, ec);
    if (ec) throw std::runtime_error(d.string() + ": cannot create the directory: " + ec.message());
    std::string path = (d / ("memnode-" + std::to_string(memnode_id) + ".img")).string();
    RegionHeader h;
    std::memcpy(&h, region, sizeof h);
    auto t0 = std::chrono::steady_clock::now();
    ImageInfo info = write_image(path, region, region_size, region_used_bytes(h), memnode_id);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("stored region image {}: {} used of {}, mode {}, node count word {}, checksum {:#018x}, {:.2f} s",
                 path, format_bytes(info.used_bytes), format_bytes(info.region_size), fabric::mode_name(info.mode),
                 info.node_count, info.body_checksum, s);
    rep.ok = 1;
    rep.file_bytes = info.file_bytes;
    rep.used_bytes = info.used_bytes;
    rep.checksum = info.body_checksum;
    rep.message_len = admin::put_text(rep.message, sizeof rep.message, path);
  } catch (const std::exception& e) {
    spdlog::error("store request (directory '{}') failed: {}", dir, e.what());
    rep.ok = 0;
    rep.message_len = admin::put_text(rep.message, sizeof rep.message, e.what());
  }
  return rep;
}

admin::StatsReply stats(const admin::StatsRequest& req, uint16_t memnode_id, uint64_t messages_served) {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto us = [](const timeval& t) { return static_cast<uint64_t>(t.tv_sec) * 1000000u + static_cast<uint64_t>(t.tv_usec); };
  admin::StatsReply rep{};
  rep.type = static_cast<uint32_t>(admin::MsgType::StatsReply);
  rep.memnode_id = memnode_id;
  rep.request_id = req.request_id;
  rep.cpu_user_us = us(ru.ru_utime);
  rep.cpu_system_us = us(ru.ru_stime);
  rep.messages = messages_served;
  return rep;
}

}  // namespace

std::optional<std::vector<char>> handle_admin(const std::vector<char>& payload, const char* region,
                                              uint64_t region_size, uint16_t memnode_id, uint64_t messages_served,
                                              const std::string& store_dir) {
  auto type = admin::message_type(payload.data(), payload.size());
  if (type == admin::MsgType::StatsRequest) {
    admin::StatsRequest req;
    if (!admin::decode(payload, admin::MsgType::StatsRequest, req)) return std::nullopt;
    return bytes_of(stats(req, memnode_id, messages_served));
  }
  if (type != admin::MsgType::StoreRequest) return std::nullopt;
  admin::StoreRequest req;
  if (!admin::decode(payload, admin::MsgType::StoreRequest, req)) {
    // The right type but the wrong size: a peer with another protocol revision. Say so.
    admin::StoreReply rep{};
    rep.type = static_cast<uint32_t>(admin::MsgType::StoreReply);
    rep.memnode_id = memnode_id;
    if (payload.size() >= offsetof(admin::StoreRequest, request_id) + sizeof rep.request_id)
      std::memcpy(&rep.request_id, payload.data() + offsetof(admin::StoreRequest, request_id), sizeof rep.request_id);
    rep.message_len = admin::put_text(rep.message, sizeof rep.message,
                                      "malformed store request: " + std::to_string(payload.size()) +
                                          " bytes, expected " + std::to_string(sizeof(admin::StoreRequest)));
    spdlog::warn("{}", rep.message);
    return bytes_of(rep);
  }
  return bytes_of(store(req, region, region_size, memnode_id, store_dir));
}

}  // namespace dmhnsw::memory
