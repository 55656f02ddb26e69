// Region image files (memory/image.hpp) and the memnode's admin handler: round trips, and
// every truncated, corrupted or mismatched file refused with a message naming it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <vector>

#include "../common/test_util.hpp"
#include "memory/admin.hpp"
#include "memory/admin_service.hpp"
#include "memory/image.hpp"

using namespace dmhnsw;
using namespace dmhnsw::memory;
using Catch::Contains;
using dmhnsw::test::read_bytes;
using dmhnsw::test::TempDir;
using dmhnsw::test::write_bytes;

namespace {

constexpr uint64_t kRegion = 2u << 20;
constexpr uint64_t kHdr = sizeof(ImageHeader);

/// A region of `size` bytes for memnode `id`: a SHINE-like header with a bump pointer
/// `extra` bytes past the data offset, and a recognizable pattern up to it.
std::vector<char> make_region(uint16_t id, uint64_t size, uint64_t extra) {
  std::vector<char> r(size, 0);
  RegionHeader h = make_region_header(id, size);
  h.mode = static_cast<uint8_t>(Mode::Shine);
  h.dim = 16;
  h.mode_words[shine_word::kBump] = h.data_offset + extra;
  h.mode_words[shine_word::kNodeCount] = 4321;
  for (uint64_t i = sizeof h; i < h.data_offset + extra; ++i) r[i] = static_cast<char>((i * 131 + id) ^ (i >> 9));
  std::memcpy(r.data(), &h, sizeof h);
  return r;
}

RegionHeader header_of(const std::vector<char>& r) {
  RegionHeader h;
  std::memcpy(&h, r.data(), sizeof h);
  return h;
}

/// Index of the first differing byte, -1 when equal (a failed `==` on MiB vectors would
/// print them whole).
int64_t first_difference(const std::vector<char>& a, const std::vector<char>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::min(a.size(), b.size()));
  auto m = std::mismatch(a.begin(), a.end(), b.begin());
  return m.first == a.end() ? -1 : m.first - a.begin();
}

/// Stores `r` to `path` and returns the number of body bytes.
uint64_t store(const std::string& path, const std::vector<char>& r, uint16_t id) {
  uint64_t used = region_used_bytes(header_of(r));
  write_image(path, r.data(), r.size(), used, id);
  return used;
}

/// Rewrites an image's header checksum after a deliberate change (to reach later checks).
void reseal_header(std::vector<unsigned char>& f) {
  ImageHeader h;
  std::memcpy(&h, f.data(), sizeof h);
  h.header_checksum = checksum64(&h, offsetof(ImageHeader, header_checksum));
  std::memcpy(f.data(), &h, sizeof h);
}
/// Recomputes body and header checksums after a deliberate change of the body.
void reseal(std::vector<unsigned char>& f) {
  ImageHeader h;
  std::memcpy(&h, f.data(), sizeof h);
  h.body_checksum = checksum64(f.data() + kHdr, f.size() - kHdr);
  std::memcpy(f.data(), &h, sizeof h);
  reseal_header(f);
}

}  // namespace

TEST_CASE("checksum64: streaming equals one-shot, every single-byte change and length change is seen", "[image]") {
  std::vector<unsigned char> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7 + 3);
  const uint64_t whole = checksum64(data.data(), data.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{31}, size_t{32}, size_t{33}, size_t{500}, size_t{999}}) {
    Checksum64 c;
    c.update(data.data(), split);
    c.update(data.data() + split, 3 < data.size() - split ? 3 : data.size() - split);
    size_t done = split + (3 < data.size() - split ? 3 : data.size() - split);
    c.update(data.data() + done, data.size() - done);
    CHECK(c.digest() == whole);
  }
  for (size_t i = 0; i < data.size(); ++i) {
    auto copy = data;
    copy[i] ^= 0x10;
    if (checksum64(copy.data(), copy.size()) == whole) FAIL("a flipped bit at byte " << i << " went unnoticed");
  }
  CHECK(checksum64(data.data(), 999) != whole);
  std::vector<unsigned char> zeros(64, 0);
  CHECK(checksum64(zeros.data(), 63) != checksum64(zeros.data(), 64));
  CHECK(checksum64(zeros.data(), 0) != checksum64(zeros.data(), 1));
}

TEST_CASE("region_used_bytes: bump pointer, data offset, clamped to the region, whole region for d-HNSW",
          "[image]") {
  RegionHeader h = make_region_header(0, kRegion);
  CHECK(region_used_bytes(h) == h.data_offset);  // bump word 0
  h.mode = static_cast<uint8_t>(Mode::Shine);
  h.mode_words[shine_word::kBump] = h.data_offset + 1000;
  CHECK(region_used_bytes(h) == h.data_offset + 1000);
  h.mode_words[shine_word::kBump] = 64;  // below the data area: the data offset still counts
  CHECK(region_used_bytes(h) == h.data_offset);
  h.mode_words[shine_word::kBump] = kRegion + 4096;  // a fetch_add that overshot the end
  CHECK(region_used_bytes(h) == kRegion);
  h.mode = static_cast<uint8_t>(Mode::Dhnsw);
  h.mode_words[shine_word::kBump] = 0;
  CHECK(region_used_bytes(h) == kRegion);
}

TEST_CASE("an image round-trips: same bytes, sizes, checksum, no temporary file left", "[image]") {
  TempDir dir;
  const std::string path = dir.file("memnode-1.img");
  auto r = make_region(1, kRegion, 100003);
  const uint64_t used = region_used_bytes(header_of(r));
  ImageInfo w = write_image(path, r.data(), r.size(), used, 1);
  CHECK(w.path == path);
  CHECK(w.used_bytes == used);
  CHECK(w.file_bytes == kHdr + used);
  CHECK(w.mode == Mode::Shine);
  CHECK(w.node_count == 4321);
  CHECK(std::filesystem::file_size(path) == kHdr + used);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));

  ImageHeader ih = read_image_header(path);
  CHECK(ih.memnode_id == 1);
  CHECK(ih.region_size == kRegion);
  CHECK(ih.used_bytes == used);
  CHECK(ih.body_checksum == w.body_checksum);

  SECTION("into a region of the same size") {
    std::vector<char> back(kRegion, 0);
    ImageInfo l = load_image(path, back.data(), back.size(), 1);
    CHECK(l.body_checksum == w.body_checksum);
    CHECK(l.used_bytes == used);
    CHECK(l.region_size == kRegion);
    CHECK(l.node_count == 4321);
    CHECK(l.mode == Mode::Shine);
    CHECK(first_difference(back, r) == -1);  // meaningful bytes equal, the rest zero as in the original
  }
  SECTION("into a larger region: the header's region size grows, nothing else changes") {
    std::vector<char> back(2 * kRegion, 0);
    load_image(path, back.data(), back.size(), 1);
    RegionHeader h = header_of(back);
    CHECK(h.region_size == 2 * kRegion);
    h.region_size = kRegion;
    CHECK(std::memcmp(&h, r.data(), sizeof h) == 0);
    CHECK(std::memcmp(back.data() + sizeof h, r.data() + sizeof h, kRegion - sizeof h) == 0);
    CHECK(std::all_of(back.begin() + kRegion, back.end(), [](char c) { return c == 0; }));
  }
  SECTION("storing again overwrites the file atomically with the same content") {
    ImageInfo w2 = write_image(path, r.data(), r.size(), used, 1);
    CHECK(w2.body_checksum == w.body_checksum);
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  }
}

TEST_CASE("a truncated image is refused, naming the file and where its data ends", "[image]") {
  TempDir dir;
  const std::string good = dir.file("good.img");
  auto r = make_region(0, kRegion, 5000);
  const uint64_t used = store(good, r, 0);
  auto bytes = read_bytes(good);
  REQUIRE(bytes.size() == kHdr + used);
  for (uint64_t cut : {uint64_t{0}, uint64_t{50}, kHdr - 1, kHdr, kHdr + 4096, kHdr + used / 2, kHdr + used - 1}) {
    DYNAMIC_SECTION("cut at " << cut) {
      const std::string path = dir.file("cut.img");
      write_bytes(path, std::vector<unsigned char>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(cut)));
      std::vector<char> back(kRegion, 0);
      REQUIRE_THROWS_WITH(load_image(path, back.data(), back.size(), 0),
                          Contains(path) && Contains("truncated") && Contains("byte " + std::to_string(cut)));
      REQUIRE_THROWS_WITH(read_image_header(path), Contains(path) && Contains("truncated"));
    }
  }
  SECTION("trailing bytes after the body") {
    const std::string path = dir.file("long.img");
    auto longer = bytes;
    longer.push_back(0);
    write_bytes(path, longer);
    std::vector<char> back(kRegion, 0);
    REQUIRE_THROWS_WITH(load_image(path, back.data(), back.size(), 0),
                        Contains(path) && Contains("offset " + std::to_string(kHdr + used)) &&
                            Contains("after the end"));
  }
  SECTION("a missing file") {
    std::vector<char> back(kRegion, 0);
    REQUIRE_THROWS_WITH(load_image(dir.file("none.img"), back.data(), back.size(), 0),
                        Contains("none.img") && Contains("cannot open"));
  }
}

TEST_CASE("a corrupted image is refused, and nothing half-loaded is left in the region", "[image]") {
  TempDir dir;
  const std::string good = dir.file("good.img");
  auto r = make_region(0, kRegion, 7777);
  const uint64_t used = store(good, r, 0);
  const auto bytes = read_bytes(good);
  const std::string path = dir.file("bad.img");

  SECTION("one flipped byte in the body") {
    for (uint64_t off : {kHdr, kHdr + 20, kHdr + 4096, kHdr + used / 2, kHdr + used - 1}) {
      auto f = bytes;
      f[off] ^= 0x01;
      write_bytes(path, f);
      std::vector<char> back(kRegion, 0);
      INFO("flipped byte at offset " << off);
      REQUIRE_THROWS_WITH(load_image(path, back.data(), back.size(), 0),
                          Contains(path) && Contains("body checksum mismatch") && Contains("corrupted"));
      CHECK(std::all_of(back.begin(), back.begin() + kHeaderPageBytes, [](char c) { return c == 0; }));
    }
  }
  SECTION("one flipped byte in the header") {
    for (uint64_t off : {uint64_t{12}, uint64_t{16}, uint64_t{24}, uint64_t{33}, uint64_t{44}, uint64_t{100},
                         uint64_t{121}}) {
      auto f = bytes;
      f[off] ^= 0x40;
      write_bytes(path, f);
      std::vector<char> back(kRegion, 0);
      INFO("flipped byte at offset " << off);
      REQUIRE_THROWS_WITH(load_image(path, back.data(), back.size(), 0),
                          Contains(path) && Contains("offset 120") && Contains("header checksum mismatch"));
    }
  }
  SECTION("wrong magic") {
    auto f = bytes;
    f[3] = 'x';
    write_bytes(path, f);
    std::vector<char> back(kRegion, 0);
    REQUIRE_THROWS_WITH(load_image(path, back.data(), back.size(), 0),
                        Contains(path) && Contains("offset 0") && Contains("bad magic"));
    write_bytes(path, std::vector<unsigned char>(4096, 0x5a));
    REQUIRE_THROWS_WITH(load_image(path, back.data(), back.size(), 0), Contains(path) && Contains("bad magic"));
  }
  SECTION("wrong version") {
    auto f = bytes;
    uint32_t v = kImageFormatVersion + 1;
    std::memcpy(f.data() + offsetof(ImageHeader, version), &v, sizeof v);
    reseal_header(f);
    write_bytes(path, f);
    std::vector<char> back(kRegion, 0);
    REQUIRE_THROWS_WITH(load_image(path, back.data(), back.size(), 0),
                        Contains(path) && Contains("offset 8") && Contains("version " + std::to_string(v)));
  }
  SECTION("a region header inside the body that does not validate") {
    auto f = bytes;
    f[kHdr + 2] ^= 0x01;  // region magic
    reseal(f);
    write_bytes(path, f);
    std::vector<char> back(kRegion, 0);
    REQUIRE_THROWS_WITH(load_image(path, back.data(), back.size(), 0),
                        Contains(path) && Contains("region header at offset 0") && Contains("bad magic"));
    CHECK(std::all_of(back.begin(), back.begin() + kHeaderPageBytes, [](char c) { return c == 0; }));
  }
  SECTION("a used size beyond the region") {
    auto f = bytes;
    uint64_t u = kRegion + 1;
    std::memcpy(f.data() + offsetof(ImageHeader, used_bytes), &u, sizeof u);
    reseal_header(f);
    write_bytes(path, f);
    REQUIRE_THROWS_WITH(read_image_header(path), Contains(path) && Contains("offset 24") && Contains("used bytes"));
  }
}

TEST_CASE("a mismatched image is refused: too large for --region, another memnode's", "[image]") {
  TempDir dir;
  const std::string path = dir.file("memnode-1.img");
  auto r = make_region(1, kRegion, 3000);
  const uint64_t used = store(path, r, 1);

  SECTION("image region larger than the memnode's region") {
    std::vector<char> small(1u << 20, 0);
    REQUIRE_THROWS_WITH(load_image(path, small.data(), small.size(), 1),
                        Contains(path) && Contains(std::to_string(kRegion)) && Contains(std::to_string(1u << 20)) &&
                            Contains("--region"));
  }
  SECTION("file of another memnode") {
    std::vector<char> back(kRegion, 0);
    REQUIRE_THROWS_WITH(load_image(path, back.data(), back.size(), 2),
                        Contains(path) && Contains("memnode 1") && Contains("--id 2"));
  }
  SECTION("region header of another memnode inside a file that claims this one") {
    auto f = read_bytes(path);
    uint16_t other = 3;
    std::memcpy(f.data() + kHdr + offsetof(RegionHeader, memnode_id), &other, sizeof other);
    reseal(f);
    write_bytes(path, f);
    std::vector<char> back(kRegion, 0);
    REQUIRE_THROWS_WITH(load_image(path, back.data(), back.size(), 1),
                        Contains(path) && Contains("offset " + std::to_string(kHdr + 20)) &&
                            Contains("memnode 3") && Contains("--id 1"));
  }
  SECTION("write_image refuses sizes that do not fit and names the temporary file it cannot create") {
    CHECK_THROWS_WITH(write_image(dir.file("x.img"), r.data(), r.size(), r.size() + 1, 1), Contains("x.img"));
    CHECK_THROWS_WITH(write_image(dir.file("x.img"), r.data(), r.size(), used, 2), Contains("memnode 1"));
    CHECK_THROWS_WITH(write_image(dir.file("no/such/dir/x.img"), r.data(), r.size(), used, 1),
                      Contains("no/such/dir/x.img.tmp") && Contains("cannot create"));
  }
}

TEST_CASE("the memnode's admin handler stores on request, echoes everything else", "[image][admin]") {
  TempDir dir;
  auto r = make_region(4, kRegion, 12345);
  const uint64_t used = region_used_bytes(header_of(r));

  std::string ping = "ping from computenode 0";
  CHECK_FALSE(handle_admin(std::vector<char>(ping.begin(), ping.end()), r.data(), r.size(), 4).has_value());
  CHECK_FALSE(handle_admin({}, r.data(), r.size(), 4).has_value());

  const std::string sub = dir.file("a/b");  // created by the handler
  admin::StoreRequest req = admin::make_store_request(sub, 77);
  std::vector<char> payload(sizeof req);
  std::memcpy(payload.data(), &req, sizeof req);
  auto out = handle_admin(payload, r.data(), r.size(), 4, 0, dir.file(""));
  REQUIRE(out.has_value());
  admin::StoreReply rep;
  REQUIRE(admin::decode(*out, admin::MsgType::StoreReply, rep));
  std::string text = admin::get_text(rep.message, sizeof rep.message, rep.message_len);
  INFO(text);
  CHECK(rep.ok == 1);
  CHECK(rep.request_id == 77);
  CHECK(rep.memnode_id == 4);
  CHECK(rep.used_bytes == used);
  CHECK(rep.file_bytes == kHdr + used);
  CHECK(text == std::filesystem::weakly_canonical(sub + "/memnode-4.img").string());
  // The image is the user's index: readable by its owner only.
  CHECK((std::filesystem::status(text).permissions() & std::filesystem::perms::all) ==
        (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));
  std::vector<char> back(kRegion, 0);
  CHECK(load_image(text, back.data(), back.size(), 4).body_checksum == rep.checksum);
  CHECK(first_difference(back, r) == -1);

  SECTION("a failure is a reply, not an exception") {
    std::ofstream(dir.file("file")) << "x";  // a file where the directory should be
    req = admin::make_store_request(dir.file("file"), 78);
    std::memcpy(payload.data(), &req, sizeof req);
    out = handle_admin(payload, r.data(), r.size(), 4, 0, dir.file(""));
    REQUIRE(admin::decode(*out, admin::MsgType::StoreReply, rep));
    CHECK(rep.ok == 0);
    CHECK(rep.request_id == 78);
    CHECK_THAT(admin::get_text(rep.message, sizeof rep.message, rep.message_len), Contains(dir.file("file")));
  }
  SECTION("only inside --store-dir: outside it, through .., or without one, a store is refused") {
    for (const std::string& where : {std::string("/tmp/dmhnsw-outsider"), dir.file("a/../../escape"),
                                     std::string("../escape")}) {
      INFO(where);
      req = admin::make_store_request(where, 79);
      std::memcpy(payload.data(), &req, sizeof req);
      out = handle_admin(payload, r.data(), r.size(), 4, 0, dir.file("a"));
      REQUIRE(admin::decode(*out, admin::MsgType::StoreReply, rep));
      CHECK(rep.ok == 0);
      CHECK_THAT(admin::get_text(rep.message, sizeof rep.message, rep.message_len), Contains("outside"));
    }
    CHECK_FALSE(std::filesystem::exists("/tmp/dmhnsw-outsider"));
    req = admin::make_store_request("b2", 80);  // relative: under --store-dir
    std::memcpy(payload.data(), &req, sizeof req);
    out = handle_admin(payload, r.data(), r.size(), 4, 0, dir.file("a"));
    REQUIRE(admin::decode(*out, admin::MsgType::StoreReply, rep));
    CHECK(rep.ok == 1);
    CHECK(std::filesystem::exists(dir.file("a/b2/memnode-4.img")));
    out = handle_admin(payload, r.data(), r.size(), 4);  // no --store-dir
    REQUIRE(admin::decode(*out, admin::MsgType::StoreReply, rep));
    CHECK(rep.ok == 0);
    CHECK_THAT(admin::get_text(rep.message, sizeof rep.message, rep.message_len), Contains("--store-dir"));
  }
  SECTION("a store request of the wrong size is answered as malformed") {
    payload.resize(100);
    out = handle_admin(payload, r.data(), r.size(), 4);
    REQUIRE(admin::decode(*out, admin::MsgType::StoreReply, rep));
    CHECK(rep.ok == 0);
    CHECK(rep.request_id == 77);
    CHECK_THAT(admin::get_text(rep.message, sizeof rep.message, rep.message_len), Contains("malformed"));
  }
  SECTION("paths that do not fit are refused on the sending side") {
    CHECK_THROWS(admin::make_store_request("", 1));
    CHECK_THROWS(admin::make_store_request(std::string(admin::kDirBytes, 'a'), 1));
  }
}
