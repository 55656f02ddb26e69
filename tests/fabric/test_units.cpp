#include <catch2/catch.hpp>

#include <cstring>

#include "common/region.hpp"
#include "common/units.hpp"

using namespace dmhnsw;

TEST_CASE("parse_bytes accepts binary units and names the flag on errors", "[units]") {
  CHECK(parse_bytes("4096", "--region") == 4096);
  CHECK(parse_bytes("64KiB", "--region") == 64 << 10);
  CHECK(parse_bytes("512MiB", "--region") == 512u << 20);
  CHECK(parse_bytes("2 GiB", "--region") == 2ull << 30);
  CHECK(parse_bytes("1g", "--region") == 1ull << 30);
  CHECK_THROWS_WITH(parse_bytes("12XB", "--region"), Catch::Contains("--region") && Catch::Contains("XB"));
  CHECK_THROWS_WITH(parse_bytes("GiB", "--region"), Catch::Contains("--region"));
  CHECK_THROWS(parse_bytes("99999999999TiB", "--region"));
  CHECK(format_bytes(1536) == "1.5 KiB");
}

TEST_CASE("region header: layout, fresh values, validation", "[region]") {
  RegionHeader h = make_region_header(3, 256u << 20);
  CHECK(h.magic == kRegionMagic);
  CHECK(h.memnode_id == 3);
  CHECK(h.mode == 0);
  CHECK(h.scratch_offset == kHeaderPageBytes);
  CHECK(h.data_offset == h.scratch_offset + h.scratch_size);
  CHECK(h.data_offset <= h.region_size);
  CHECK(mode_word_offset(shine_word::kBump) == 128);
  CHECK(mode_word_offset(shine_word::kBump) % 8 == 0);
  CHECK_NOTHROW(validate_region_header(h, "test"));
  CHECK_THROWS_WITH(make_region_header(0, 1000), Catch::Contains("--region"));

  RegionHeader bad = h;
  bad.magic ^= 1;
  CHECK_THROWS_WITH(validate_region_header(bad, "img"), Catch::Contains("img") && Catch::Contains("magic"));
  bad = h;
  bad.version = 99;
  CHECK_THROWS_WITH(validate_region_header(bad, "img"), Catch::Contains("version 99"));
  bad = h;
  bad.scratch_size = h.region_size;
  CHECK_THROWS_WITH(validate_region_header(bad, "img"), Catch::Contains("offset 40"));
  bad = h;
  bad.mode = 9;
  CHECK_THROWS_WITH(validate_region_header(bad, "img"), Catch::Contains("mode"));
}

TEST_CASE("split_commas drops empty items", "[units]") {
  CHECK(split_commas("a,b,,c") == std::vector<std::string>{"a", "b", "c"});
  CHECK(split_commas("") .empty());
  CHECK(split_commas("127.0.0.1:7000") == std::vector<std::string>{"127.0.0.1:7000"});
  CHECK(split_commas(",x,") == std::vector<std::string>{"x"});
}
