// Compressed vectors: the quantizer and its block (compute/codes.hpp), and a shine
// index built with codes on LocalFabric: every inserted node's code in its memnode's log.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "common/fabric/local/local_fabric.hpp"
#include "common/region.hpp"
#include "compute/codes.hpp"
#include "gaussian.hpp"
#include "compute/shine/codes_log.hpp"
#include "compute/shine/graph.hpp"

using namespace dmhnsw;
using namespace dmhnsw::shine;
using dmhnsw::testing::gaussian;
using compute::CodeKind;
using compute::Quantizer;

namespace {

/// Largest |x - decode(encode(x))| over the rows, relative to the data's spread (1 here).
double worst_error(const Quantizer& q, const std::vector<float>& x, size_t d) {
  const size_t n = x.size() / d;
  std::vector<uint8_t> codes(n * q.code_size());
  std::vector<float> back(x.size());
  q.encode(x.data(), n, codes.data());
  q.decode(codes.data(), n, back.data());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(x[i] - back[i])));
  return worst;
}

}  // namespace

TEST_CASE("codes: --codes parses none, sq8 and pq:M and refuses anything else naming it", "[codes]") {
  CHECK(compute::parse_codes("none").kind == CodeKind::None);
  CHECK(compute::parse_codes("sq8").kind == CodeKind::Sq8);
  const auto pq = compute::parse_codes("pq:8");
  CHECK((pq.kind == CodeKind::Pq && pq.pq_m == 8 && pq.to_string() == "pq:8"));
  for (const char* bad : {"sq4", "pq:", "pq:0", "pq:x", "pq:8x", "PQ:8"})
    CHECK_THROWS_WITH(compute::parse_codes(bad), Catch::Contains("--codes '" + std::string(bad) + "'"));
}

TEST_CASE("codes: SQ8 and PQ trained with Faiss survive their block, and a corrupted block is refused naming the offset",
          "[codes]") {
  const size_t d = 32;
  const auto x = gaussian(2000, d, 5);
  for (const char* text : {"sq8", "pq:8"}) {
    DYNAMIC_SECTION(text) {
      const auto q = Quantizer::train(compute::parse_codes(text), x.data(), 2000, d, Metric::L2);
      CHECK(q->code_size() == (q->spec().kind == CodeKind::Sq8 ? d : 8));
      // SQ8: 256 steps over each dimension's range (~7 sigma): under 0.03; PQ: coarse.
      const double err = worst_error(*q, x, d);
      CHECK(err < (q->spec().kind == CodeKind::Sq8 ? 0.03 : 3.0));
      const std::vector<char> block = q->serialize();
      const auto back = Quantizer::load(block.data(), block.size(), "memnode 0", 4096);
      CHECK(back->spec().to_string() == text);
      CHECK(back->code_size() == q->code_size());
      std::vector<uint8_t> a(q->code_size()), b(q->code_size());
      q->encode(x.data(), 1, a.data());
      back->encode(x.data(), 1, b.data());
      CHECK(a == b);  // the same quantizer after the round trip

      // The distance to a code is the distance to the vector it decodes to (l2 and ip scales).
      for (Metric metric : {Metric::L2, Metric::IP}) {
        const auto qm = metric == Metric::L2 ? q : Quantizer::train(q->spec(), x.data(), 2000, d, metric);
        const DistanceComputer exact(metric, d);
        std::vector<uint8_t> code(qm->code_size());
        std::vector<float> dec(d);
        for (size_t i = 0; i < 20; ++i) {
          const float* query = x.data() + (100 + i) * d;
          const auto dist = qm->distance_to(query);
          qm->encode(x.data() + i * d, 1, code.data());
          qm->decode(code.data(), 1, dec.data());
          const float want = exact(query, dec.data());
          CHECK((*dist)(code.data()) == Approx(want).epsilon(1e-3).margin(1e-3));
        }
      }

      auto corrupt = block;
      corrupt[block.size() - 5] ^= 0x40;  // inside the payload
      CHECK_THROWS_WITH(Quantizer::load(corrupt.data(), corrupt.size(), "memnode 0", 4096),
                        Catch::Contains("memnode 0: codes block at offset " + std::to_string(4096 + 40)) &&
                            Catch::Contains("checksum"));
      corrupt = block;
      corrupt[0] = 'X';
      CHECK_THROWS_WITH(Quantizer::load(corrupt.data(), corrupt.size(), "memnode 0", 4096),
                        Catch::Contains("offset 4096") && Catch::Contains("magic"));
      corrupt = block;
      const uint64_t huge = uint64_t{1} << 40;
      std::memcpy(corrupt.data() + offsetof(compute::CodesHeader, payload_bytes), &huge, 8);
      CHECK_THROWS_WITH(Quantizer::load(corrupt.data(), corrupt.size(), "memnode 0", 4096),
                        Catch::Contains("offset " + std::to_string(4096 + 32)));
      CHECK_THROWS_WITH(Quantizer::load(block.data(), 20, "memnode 0", 4096), Catch::Contains("shorter than its header"));
    }
  }
  CHECK_THROWS_WITH(Quantizer::train(compute::parse_codes("pq:5"), x.data(), 2000, d, Metric::L2),
                    Catch::Contains("do not divide the dimension 32"));
}

TEST_CASE("codes: a shine index built with codes holds every node's code in its memnode's log", "[codes][shine]") {
  const size_t n = 1500, d = 16;
  const auto x = gaussian(n, d, 9);
  auto c = fabric::LocalCluster::create(2, 64u << 20);
  for (uint16_t i = 0; i < 2; ++i) {
    RegionHeader h = make_region_header(i, 64u << 20);
    std::memcpy(c->region(i), &h, sizeof h);
  }
  c->refresh_headers();
  auto ep = c->make_endpoint(16u << 20);
  GraphParams p;
  p.dim = d;
  p.m = 8;
  p.ef_construction = 48;
  p.codes = Quantizer::train(compute::parse_codes("sq8"), x.data(), n, d, Metric::L2);
  p.codes_capacity = n;  // per memnode: room for all
  const GraphParams got = format_or_attach(*c, *ep, &p);
  c->refresh_headers();
  REQUIRE(got.codes);
  CHECK(got.codes->code_size() == d);
  CHECK(got.codes_log.capacity == n);
  CHECK(got.records >= got.codes_log.offset + got.codes_log.bytes());
  Graph g(*c, got);
  compute::Scheduler s(*ep);
  Worker w(g, s, 3);
  OpContext ctx;
  for (size_t i = 0; i < n; ++i) compute::run_sync(s, w.insert(&x[i * d], i, ctx));

  // A computenode attaching later loads the same quantizer and finds every node's code.
  auto ep2 = c->make_endpoint(16u << 20);
  const GraphParams attached = format_or_attach(*c, *ep2, nullptr);
  REQUIRE(attached.codes);
  const LocalCodes codes = LocalCodes::load(*ep2, attached);
  CHECK(codes.size() == n);
  CHECK(codes.entries()[0] + codes.entries()[1] == n);
  CHECK(codes.entries()[0] > n / 4);  // spread over both memnodes
  CHECK(codes.entries()[1] > n / 4);
  // Each node's code decodes near its own vector (the label says which).
  size_t checked = 0;
  for (uint16_t m = 0; m < 2; ++m) {
    std::vector<char> e(attached.codes_log.entry_bytes());
    for (uint64_t i = 0; i < codes.entries()[m]; ++i) {
      ep2->read(RemotePtr(m, attached.codes_log.entry_offset(i)), e.data(), e.size());
      uint64_t raw, label;
      std::memcpy(&raw, e.data(), 8);
      std::memcpy(&label, e.data() + 8, 8);
      REQUIRE(label < n);
      const uint8_t* code = codes.find(RemotePtr::from_raw(raw));
      REQUIRE(code != nullptr);
      CHECK(codes.label(RemotePtr::from_raw(raw)) == label);
      std::vector<float> back(d);
      attached.codes->decode(code, 1, back.data());
      double err = 0;
      for (size_t j = 0; j < d; ++j) err = std::max(err, static_cast<double>(std::fabs(back[j] - x[label * d + j])));
      CHECK(err < 0.05);
      ++checked;
    }
  }
  CHECK(checked == n);

  // A corrupted codes block stops every computenode that attaches, naming memnode 0 and the offset.
  c->region(0)[attached.codes_block + 70] ^= 0x10;
  auto ep3 = c->make_endpoint(16u << 20);
  CHECK_THROWS_WITH(format_or_attach(*c, *ep3, nullptr),
                    Catch::Contains("memnode 0: codes block at offset " + std::to_string(attached.codes_block + 40)));
}
