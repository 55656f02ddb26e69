// Configuration text: every flag value a user or a config file (CLI11 --config) hands to our
// own parsers, and the token file. Input: [token-file flag][text...]; the text goes to each of
// parse_bytes (--region, --cache-bytes), parse_metric (--metric), parse_wire (--wire),
// parse_host_port (--listen, --memnodes), parse_mix (--mix), Distribution::parse
// (--distribution, and the workload file's header), parse_mode, parse_provider, parse_policy,
// parse_quota_base and split_commas (--memnodes, --ef lists); with the flag set it is also
// written as a --token-file and read with load_token. What parses is printed and parsed again.
#include <cstdint>
#include <exception>
#include <string>

#include "common/distance.hpp"
#include "common/fabric/bootstrap.hpp"
#include "common/fabric/wire.hpp"
#include "common/units.hpp"
#include "common/workload.hpp"
#include "compute/dhnsw/mixed.hpp"
#include "router/policy.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;

namespace {

template <class F>
void expect_ok_or_throw(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::TempFile token_file(".token");
  fuzz::Input in(data, size);
  const bool token = in.flag();
  const std::string text = in.rest_text();

  expect_ok_or_throw([&] {
    const uint64_t b = parse_bytes(text, "--region");
    DMHNSW_FUZZ_CHECK(parse_bytes(std::to_string(b), "--region") == b);
    (void)format_bytes(b);
  });
  expect_ok_or_throw([&] {
    const Metric m = parse_metric(text);
    DMHNSW_FUZZ_CHECK(parse_metric(to_string(m)) == m);
  });
  expect_ok_or_throw([&] {
    const fabric::WireModel w = fabric::parse_wire(text);
    DMHNSW_FUZZ_CHECK(w.latency_us >= 0 && w.latency_us <= 1e6 && w.gbytes_per_s >= 0 && w.gbytes_per_s <= 1e4);
    (void)fabric::describe(w);
    (void)w.transfer(1u << 20);
  });
  expect_ok_or_throw([&] {
    const auto [host, port] = fabric::parse_host_port(text, "--listen");
    DMHNSW_FUZZ_CHECK(!host.empty());
    DMHNSW_FUZZ_CHECK(fabric::parse_host_port(host + ":" + std::to_string(port), "--listen").second == port);
  });
  expect_ok_or_throw([&] {
    const double p = dhnsw::parse_mix(text);
    DMHNSW_FUZZ_CHECK(p >= 0 && p < 1);
  });
  expect_ok_or_throw([&] {
    const Distribution d = Distribution::parse(text);
    const Distribution again = Distribution::parse(d.to_string());
    DMHNSW_FUZZ_CHECK(again.kind == d.kind && again.s == d.s);
  });
  expect_ok_or_throw([&] {
    const fabric::Mode m = fabric::parse_mode(text);
    DMHNSW_FUZZ_CHECK(fabric::parse_mode(fabric::mode_name(m)) == m);
  });
  expect_ok_or_throw([&] {
    const fabric::Provider p = fabric::parse_provider(text);
    DMHNSW_FUZZ_CHECK(fabric::parse_provider(fabric::provider_name(p)) == p);
  });
  expect_ok_or_throw([&] {
    const router::Policy p = router::parse_policy(text);
    DMHNSW_FUZZ_CHECK(router::parse_policy(router::policy_name(p)) == p);
  });
  expect_ok_or_throw([&] {
    const router::QuotaBase q = router::parse_quota_base(text);
    DMHNSW_FUZZ_CHECK(router::parse_quota_base(router::quota_base_name(q)) == q);
  });
  size_t total = 0;
  for (const std::string& item : split_commas(text)) {
    DMHNSW_FUZZ_CHECK(!item.empty() && item.find(',') == std::string::npos);
    total += item.size();
  }
  DMHNSW_FUZZ_CHECK(total <= text.size());
  if (token) {
    const std::string& path = token_file.write(text.data(), text.size());
    expect_ok_or_throw([&] {
      const std::string t = fabric::load_token(path);
      DMHNSW_FUZZ_CHECK(!t.empty() && t.size() <= text.size() && t.find('\n') == std::string::npos);
    });
  }
  return 0;
}
