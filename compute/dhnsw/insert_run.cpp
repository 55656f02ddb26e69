#include "compute/write_gate.hpp"
#include "compute/dhnsw/insert_run.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "common/dataset.hpp"
#include "common/timing.hpp"
#include "compute/dhnsw/control.hpp"

namespace dmhnsw::dhnsw {

nlohmann::json run_insert(const compute::RunContext& rc, const InsertOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  FloatMatrix data;
  try {
    data = load_vectors_as_float(o.data);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--data: ") + e.what());
  }
  if (!data.contiguous()) data = data.copy();
  auto ep = c.make_endpoint(64u << 20);
  std::unique_ptr<Index> probe = std::make_unique<Index>(load_index(c, *ep));
  const Index& index = *probe;
  if (data.d() != index.header.dim)
    throw std::invalid_argument("--data " + o.data + " has dimension " + std::to_string(data.d()) +
                                ", the d-HNSW index on the memnodes " + std::to_string(index.header.dim));
  uint64_t max_fetch = 0;
  for (const auto& s : index.subs) max_fetch = std::max(max_fetch, s.block_bytes + s.overflow_bytes);
  // Room for a fetch, and for a rebuild's 32 MiB of WRITEs in flight.
  if (max_fetch + (40u << 20) > (64u << 20)) ep = c.make_endpoint(max_fetch + (40u << 20));
  const size_t end = o.end == 0 ? data.n() : std::min(o.end, data.n());
  if (o.begin >= end)
    throw std::invalid_argument("--begin " + std::to_string(o.begin) + " is past the data's " + std::to_string(end) + " rows");
  if (!o.ids.empty() && o.ids.size() < end)
    throw std::invalid_argument("--ids holds " + std::to_string(o.ids.size()) + " ids; rows [" + std::to_string(o.begin) +
                                ", " + std::to_string(end) + ") of --data " + o.data + " need one each");
  std::vector<size_t> mine;
  for (size_t i = o.begin; i < end; ++i)
    if (i % o.share_count == o.share_index) mine.push_back(i);
  probe.reset();
  Inserter ins(c, *ep, rc.cn_id, o.tuning);
  compute::WriteGate gate(c);  // each batch under a pass: a snapshot waits for it, and it for the snapshot
  const auto t0 = Clock::now();
  auto last = t0;
  std::vector<float> xs;
  std::vector<int64_t> ids;
  std::vector<double> batch_ms;
  const uint32_t B = std::max<uint32_t>(1, o.batch);
  for (size_t at = 0; at < mine.size(); at += B) {
    const size_t n = std::min<size_t>(B, mine.size() - at);
    xs.resize(n * data.d());
    ids.resize(n);
    for (size_t j = 0; j < n; ++j) {
      std::memcpy(xs.data() + j * data.d(), data.row(mine[at + j]), sizeof(float) * data.d());
      ids[j] = o.ids.empty() ? o.id_offset + static_cast<int64_t>(mine[at + j]) : o.ids[mine[at + j]];
    }
    const auto b0 = Clock::now();
    compute::WriteGate::Pass pass(gate);
    ins.insert(xs.data(), ids.data(), n, o.upsert);
    batch_ms.push_back(seconds_since(b0) * 1e3);
    if (seconds_since(last) > 2) {
      last = Clock::now();
      spdlog::info("dhnsw {}: {} / {} acknowledged ({:.0f}/s)", o.upsert ? "upsert" : "insert", at + n, mine.size(),
                   static_cast<double>(at + n) / seconds(last - t0));
    }
  }
  const double s = seconds_since(t0);
  leave_epochs(*ep, rc.cn_id);
  nlohmann::json r;
  r["tool"] = "computenode dhnsw insert";
  r["mode"] = "dhnsw";
  r["kind"] = o.upsert ? "upsert" : "insert";
  r["cn_id"] = rc.cn_id;
  r["num_cns"] = rc.num_cns;
  r["provider"] = rc.provider;
  r["data"] = o.data;
  r["rows"] = {{"begin", o.begin}, {"end", end}, {"mine", mine.size()}, {"id_offset", o.id_offset},
               {"ids", o.ids.empty() ? "row + id_offset" : "--ids"},
               {"share", std::to_string(o.share_index) + "/" + std::to_string(o.share_count)}};
  r["batch"] = B;
  r["insert"] = ins.stats().to_json(s);
  r["batch_ms"] = {{"p50", percentile(batch_ms, 0.5)}, {"p99", percentile(batch_ms, 0.99)}};
  return r;
}

void print_insert(const nlohmann::json& r) {
  const auto& i = r["insert"];
  std::printf("dhnsw %s (computenode %u): %llu vectors in %.2f s (%.0f inserts/s), %llu commits; per insert "
              "%.2f WRITEs, %.3f doorbells, %.0f bytes; lock waits %llu, takeovers %llu, repairs %llu\n",
              r["kind"].get<std::string>().c_str(), r["cn_id"].get<unsigned>(), static_cast<unsigned long long>(i["inserted"].get<uint64_t>()),
              i["seconds"].get<double>(), i["inserts_per_s"].get<double>(),
              static_cast<unsigned long long>(i["commits"].get<uint64_t>()), i["per_insert"]["writes"].get<double>(),
              i["per_insert"]["doorbells"].get<double>(), i["per_insert"]["bytes_written"].get<double>(),
              static_cast<unsigned long long>(i["lock_waits"].get<uint64_t>()),
              static_cast<unsigned long long>(i["lock_takeovers"].get<uint64_t>()),
              static_cast<unsigned long long>(i["repairs"].get<uint64_t>()));
  if (r["kind"] == "upsert")
    std::printf("  %llu of them replaced an id's vector (its old one is marked deleted)\n",
                static_cast<unsigned long long>(i["replaced"].get<uint64_t>()));
}

nlohmann::json run_delete(const compute::RunContext& rc, const DeleteOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  auto ep = c.make_endpoint(64u << 20);
  {
    const Index probe = load_index(c, *ep);
    uint64_t max_fetch = 0;
    for (const auto& s : probe.subs) max_fetch = std::max(max_fetch, s.block_bytes + s.overflow_bytes);
    if (max_fetch + (40u << 20) > (64u << 20)) ep = c.make_endpoint(max_fetch + (40u << 20));  // a rebuild's
  }
  std::vector<int64_t> mine;
  for (size_t j = rc.cn_id; j < o.ids.size(); j += std::max<uint32_t>(1, rc.num_cns)) mine.push_back(o.ids[j]);
  Inserter ins(c, *ep, rc.cn_id, o.tuning);
  compute::WriteGate gate(c);
  const auto t0 = Clock::now();
  std::vector<int64_t> missing;
  const uint32_t B = std::max<uint32_t>(1, o.batch);
  for (size_t at = 0; at < mine.size(); at += B) {
    const size_t n = std::min<size_t>(B, mine.size() - at);
    compute::WriteGate::Pass pass(gate);
    const std::vector<int64_t> m = ins.remove(mine.data() + at, n);
    missing.insert(missing.end(), m.begin(), m.end());
  }
  const double s = seconds_since(t0);
  leave_epochs(*ep, rc.cn_id);
  nlohmann::json r;
  r["tool"] = "computenode dhnsw delete";
  r["mode"] = "dhnsw";
  r["kind"] = "delete";
  r["cn_id"] = rc.cn_id;
  r["num_cns"] = rc.num_cns;
  r["provider"] = rc.provider;
  r["requested"] = mine.size();
  r["deleted"] = ins.stats().deleted;
  r["not_found"] = missing.size();
  if (missing.size() > 1000) missing.resize(1000);
  r["not_found_ids"] = missing;
  r["seconds"] = s;
  r["deletes_per_s"] = s > 0 ? static_cast<double>(ins.stats().deleted) / s : 0.0;
  r["insert"] = ins.stats().to_json(s);
  return r;
}

void print_delete(const nlohmann::json& r) {
  std::printf("dhnsw delete (computenode %u): %llu of %llu ids deleted, %llu not in the index, %.2f s (%.0f deletes/s), "
              "%llu rebuilds\n",
              r["cn_id"].get<unsigned>(), static_cast<unsigned long long>(r["deleted"].get<uint64_t>()),
              static_cast<unsigned long long>(r["requested"].get<uint64_t>()),
              static_cast<unsigned long long>(r["not_found"].get<uint64_t>()), r["seconds"].get<double>(),
              r["deletes_per_s"].get<double>(), static_cast<unsigned long long>(r["insert"]["rebuilds"].get<uint64_t>()));
  if (r["not_found"].get<uint64_t>() > 0) {
    std::printf("  not in the index:");
    size_t shown = 0;
    for (const auto& id : r["not_found_ids"])
      if (shown++ < 20) std::printf(" %lld", static_cast<long long>(id.get<int64_t>()));
    if (r["not_found"].get<uint64_t>() > 20)
      std::printf(" ... (%llu in all)", static_cast<unsigned long long>(r["not_found"].get<uint64_t>()));
    std::printf("\n");
  }
}

}  // namespace dmhnsw::dhnsw
