#include "compute/write_gate.hpp"
#include "compute/dhnsw/mixed.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "common/dataset.hpp"
#include "common/timing.hpp"
#include "common/workload.hpp"
#include "compute/dhnsw/control.hpp"
#include "compute/dhnsw/query.hpp"

namespace dmhnsw::dhnsw {

namespace {

FloatMatrix load_insert_data(const MixedOptions& m) {
  FloatMatrix ins_data;
  if (m.insert_share > 0) {
    if (m.insert_data.empty()) throw std::invalid_argument("--mix: inserts need --insert-data");
    try {
      ins_data = load_vectors_as_float(m.insert_data);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("--insert-data: ") + e.what());
    }
    if (!ins_data.contiguous()) ins_data = ins_data.copy();
  }
  return ins_data;
}

}  // namespace

double parse_mix(const std::string& text) {
  const std::string pre = "insert:";
  if (text.rfind(pre, 0) != 0) throw std::invalid_argument("--mix '" + text + "': want insert:P, e.g. insert:0.2");
  double p = 0;
  try {
    size_t used = 0;
    p = std::stod(text.substr(pre.size()), &used);
    if (used != text.size() - pre.size()) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw std::invalid_argument("--mix '" + text + "': P is not a number");
  }
  if (!(p >= 0 && p < 1)) throw std::invalid_argument("--mix '" + text + "': P must be in [0, 1)");
  return p;
}

namespace {

/// What a mixed run counts as it goes.
struct Tally {
  nlohmann::json timeline = nlohmann::json::array();
  std::vector<double> batch_ms, insert_ms, search_ms;
  size_t inserted = 0, searched = 0;
  double r1 = 0, rk = 0, insert_s = 0, search_s = 0;
};

nlohmann::json mixed_report(const RunContext& rc, const QueryOptions& q, const MixedOptions& m, const EngineOptions& eo,
                            const Tally& t, const InsertStats& stats, double wall) {
  const double nqd = static_cast<double>(std::max<size_t>(t.searched, 1));
  const uint32_t B = eo.batch;
  nlohmann::json r = {
      {"mode", "dhnsw"},
      {"kind", "mixed"},
      {"cn_id", rc.cn_id},
      {"num_cns", rc.num_cns},
      {"provider", rc.provider},
      {"workload", q.workload},
      {"insert_data", m.insert_data},
      {"insert_share", m.insert_share},
      {"batch", B},
      {"k", eo.k},
      {"ef_search", eo.ef_search},
      {"probe", eo.probe},
      {"seconds", wall},
      {"ops_per_s", static_cast<double>(t.inserted + t.searched) / std::max(wall, 1e-9)},
      {"search", {{"queries", t.searched}, {"qps", static_cast<double>(t.searched) / std::max(wall, 1e-9)},
                  {"busy_s", t.search_s}, {"recall", t.rk / nqd}, {"recall_at_1", t.r1 / nqd},
                  {"batch_ms", {{"p50", percentile(t.search_ms, 0.5)}, {"p99", percentile(t.search_ms, 0.99)}}}}},
      {"insert", stats.to_json(t.insert_s)},
      {"insert_batch_ms", {{"p50", percentile(t.insert_ms, 0.5)}, {"p99", percentile(t.insert_ms, 0.99)}}},
      {"batch_ms", {{"p50", percentile(t.batch_ms, 0.5)}, {"p99", percentile(t.batch_ms, 0.99)},
                    {"mean", t.batch_ms.empty() ? 0.0 : std::accumulate(t.batch_ms.begin(), t.batch_ms.end(), 0.0) /
                                                           static_cast<double>(t.batch_ms.size())}}},
      {"timeline_fields", {"t_s", "inserts", "queries", "insert_ms", "search_ms", "epoch"}},
      {"timeline", t.timeline}};
  return r;
}


}  // namespace

nlohmann::json run_mixed(const RunContext& rc, const QueryOptions& q, const MixedOptions& m) {
  fabric::Cluster& c = *rc.cluster;
  const Workload wl = read_workload(q.workload);
  const FloatMatrix ins_data = load_insert_data(m);
  auto ep = c.make_endpoint(256u << 20);
  Inserter ins(c, *ep, rc.cn_id, m.tuning);
  compute::WriteGate gate(c);
  const uint32_t dim = ins.index().header.dim, k = q.engine.k;
  if (wl.dim() != dim)
    throw std::invalid_argument("--workload " + q.workload + " has dimension " + std::to_string(wl.dim()) +
                                ", the index " + std::to_string(dim));
  if (m.insert_share > 0 && ins_data.d() != dim)
    throw std::invalid_argument("--insert-data " + m.insert_data + " has dimension " + std::to_string(ins_data.d()) +
                                ", the index " + std::to_string(dim));
  std::vector<size_t> rows;
  if (m.insert_share > 0) {
    const size_t end = m.insert_end == 0 ? ins_data.n() : std::min(m.insert_end, ins_data.n());
    for (size_t i = m.insert_begin; i < end; ++i)
      if (i % rc.num_cns == rc.cn_id) rows.push_back(i);
  }
  std::vector<uint64_t> measured;
  for (uint64_t i = wl.warmup_count; i < wl.total(); ++i) measured.push_back(i);
  if (measured.empty()) throw std::invalid_argument("--workload " + q.workload + ": no measured query");

  EngineOptions eo = q.engine;
  eo.ack_slot = rc.cn_id;
  eo.ef_search = q.ef_search.front();
  const Index first = load_index(c, *ep);  // the engine's own (the inserter reloads its copy on a new epoch)
  Engine engine(c, first, eo);
  const uint32_t B = eo.batch;
  const uint32_t n_ins = static_cast<uint32_t>(std::llround(m.insert_share * B)), n_q = B - n_ins;

  Tally t;
  size_t next_row = 0, next_q = 0;
  std::vector<float> xq, xi;
  std::vector<int64_t> ids;
  const auto t0 = Clock::now();
  for (;;) {
    const bool time_left = m.seconds > 0 && seconds_since(t0) < m.seconds;
    const bool rows_left = next_row < rows.size();
    if (m.seconds > 0 ? !time_left : (n_ins > 0 ? !rows_left : next_q >= measured.size())) break;
    const auto b0 = Clock::now();
    // Inserts of the batch (fewer when the rows run out).
    const size_t ni = std::min<size_t>(n_ins, rows.size() - next_row);
    xi.resize(ni * dim);
    ids.resize(ni);
    for (size_t j = 0; j < ni; ++j) {
      std::memcpy(xi.data() + j * dim, ins_data.row(rows[next_row + j]), 4ull * dim);
      ids[j] = m.id_offset + static_cast<int64_t>(rows[next_row + j]);
    }
    next_row += ni;
    compute::WriteGate::Pass pass(gate);
    ins.insert(xi.data(), ids.data(), ni);
    const double bi = seconds_since(b0);
    // Searches of the batch.
    const size_t nq = n_ins > 0 && ni == 0 ? B : n_q;
    xq.resize(nq * dim);
    std::vector<uint64_t> which(nq);
    for (size_t j = 0; j < nq; ++j) {
      which[j] = measured[(next_q + j) % measured.size()];
      std::memcpy(xq.data() + j * dim, wl.queries.row(which[j]), 4ull * dim);
    }
    next_q += nq;
    const auto s0 = Clock::now();
    std::vector<Answer> answers;
    const RunStats rs = engine.run(xq.data(), nq, answers);
    const double bs = seconds_since(s0);
    const auto [s1, sk] = recall_sums(answers, which, wl, k);
    t.r1 += s1;
    t.rk += sk;
    t.inserted += ni;
    t.searched += nq;
    t.insert_s += bi;
    t.search_s += bs;
    const double total = seconds_since(b0);
    t.batch_ms.push_back(total * 1e3);
    if (ni > 0) t.insert_ms.push_back(bi * 1e3);
    if (nq > 0) t.search_ms.push_back(bs * 1e3);
    uint64_t epoch = ins.index().header.epoch;
    if (!rs.batches.empty()) epoch = std::max(epoch, rs.batches.back().epoch);
    t.timeline.push_back({std::chrono::duration<double>(b0 - t0).count(), ni, nq, bi * 1e3, bs * 1e3, epoch});
  }
  const double wall = seconds_since(t0);
  leave_epochs(*ep, rc.cn_id);
  return mixed_report(rc, q, m, eo, t, ins.stats(), wall);
}

void print_mixed(const nlohmann::json& r) {
  std::printf("dhnsw mixed (computenode %u): %.0f%% inserts, batch %u: %.0f ops/s over %.1f s; search %.0f QPS, "
              "R@10 %.4f, batch p50 %.1f ms; inserts %.0f/s, %llu rebuilds; batch p50 %.1f ms p99 %.1f ms\n",
              r["cn_id"].get<unsigned>(), 100 * r["insert_share"].get<double>(), r["batch"].get<unsigned>(),
              r["ops_per_s"].get<double>(), r["seconds"].get<double>(), r["search"]["qps"].get<double>(),
              r["search"]["recall"].get<double>(), r["search"]["batch_ms"]["p50"].get<double>(),
              r["insert"]["inserted"].get<double>() / std::max(r["seconds"].get<double>(), 1e-9),
              static_cast<unsigned long long>(r["insert"]["rebuilds"].get<uint64_t>()),
              r["batch_ms"]["p50"].get<double>(), r["batch_ms"]["p99"].get<double>());
}

}  // namespace dmhnsw::dhnsw
