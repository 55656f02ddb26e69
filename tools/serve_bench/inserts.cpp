// serve-bench's inserter (--insert-data): one more client, with a connection of its own, that
// sends Insert requests beside the searches for as long as they are measured, then searches
// for every row the service acknowledged, by itself, to check that none is missing. A mixed
// read-write load, and the check that an acknowledged insert survives what happened meanwhile
// (a memnode copy's death: docs/replication.md).
#include <spdlog/spdlog.h>

#include <cstring>
#include <thread>

#include "common/dataset.hpp"
#include "tools/serve_bench/serve_bench.hpp"

namespace dmhnsw::serve_bench {

Inserter::Inserter(const Options& o, std::shared_ptr<grpc::Channel> channel)
    : o_(o), stub_(pb::Search::NewStub(std::move(channel))) {
  try {
    rows_ = load_vectors_as_float(o.insert_data);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--insert-data: ") + e.what());
  }
  if (o.insert_begin >= rows_.n())
    throw std::invalid_argument("--insert-begin " + std::to_string(o.insert_begin) + ": --insert-data " +
                                o.insert_data + " has " + std::to_string(rows_.n()) + " rows");
}

void Inserter::run(Clock::time_point t0, Clock::time_point stop_at, const std::atomic<bool>& searches_done) {
  std::this_thread::sleep_until(t0);
  const size_t dim = rows_.d();
  pb::InsertRequest req;
  pb::InsertResponse resp;
  const auto gap = o_.insert_rate > 0 ? std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(1.0 / o_.insert_rate))
                                      : Clock::duration::zero();
  auto next_send = t0;
  for (uint64_t row = o_.insert_begin; row < rows_.n();) {
    if (Clock::now() >= stop_at || searches_done.load()) break;
    if (gap.count() > 0) {
      std::this_thread::sleep_until(next_send);
      next_send += gap;
    }
    const uint64_t n = std::min<uint64_t>(o_.insert_batch, rows_.n() - row);
    req.Clear();
    req.set_dim(static_cast<uint32_t>(dim));
    std::string* v = req.mutable_vectors();
    v->resize(n * dim * sizeof(float));
    for (uint64_t j = 0; j < n; ++j) {
      std::memcpy(v->data() + j * dim * sizeof(float), rows_.row(row + j), dim * sizeof(float));
      req.add_ids(static_cast<int64_t>(o_.insert_first_id + row + j));
    }
    resp.Clear();
    grpc::ClientContext ctx;
    prepare(ctx, o_);
    const auto s0 = Clock::now();
    const grpc::Status s = stub_->Insert(&ctx, req, &resp);
    latency_us_.push_back(us(Clock::now() - s0));
    ++requests_;
    if (s.ok() && resp.inserted() == n) {
      for (uint64_t j = 0; j < n; ++j) acked_.push_back(row + j);
    } else {
      // Not acknowledged: its rows may or may not be in; their ids are not asked again.
      ErrorInfo& e = errors_[s.ok() ? "PARTIAL" : code_name(s.error_code())];
      if (e.count++ == 0)
        e.first_message = s.ok() ? std::to_string(resp.inserted()) + " of " + std::to_string(n) + " inserted"
                                 : s.error_message();
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE)
        std::this_thread::sleep_until(std::min(stop_at, Clock::now() + std::chrono::milliseconds(10)));
    }
    row += n;
  }
}

void Inserter::verify() {
  const size_t dim = rows_.d();
  pb::SearchRequest req;
  pb::SearchResponse resp;
  constexpr uint64_t kPerRequest = 64;
  for (size_t at = 0; at < acked_.size(); at += kPerRequest) {
    const size_t n = std::min<size_t>(kPerRequest, acked_.size() - at);
    req.Clear();
    req.set_dim(static_cast<uint32_t>(dim));
    req.set_k(1);
    req.set_ef_search(o_.insert_verify_ef);
    req.set_probe(o_.insert_verify_probe);
    std::string* v = req.mutable_vectors();
    v->resize(n * dim * sizeof(float));
    for (size_t j = 0; j < n; ++j)
      std::memcpy(v->data() + j * dim * sizeof(float), rows_.row(acked_[at + j]), dim * sizeof(float));
    resp.Clear();
    grpc::ClientContext ctx;
    prepare(ctx, o_);
    const grpc::Status s = stub_->Search(&ctx, req, &resp);
    if (!s.ok())
      throw std::runtime_error("verifying the acknowledged inserts: Search failed: " +
                               std::string(code_name(s.error_code())) + ": " + s.error_message());
    for (size_t j = 0; j < n; ++j) {
      const int64_t want = static_cast<int64_t>(o_.insert_first_id + acked_[at + j]);
      const bool hit = static_cast<int>(j) < resp.ids_size() && resp.ids(static_cast<int>(j)) == want;  // n x 1
      if (hit)
        ++found_;
      else
        recheck(acked_[at + j], want);
    }
  }
  verified_ = true;
}

void Inserter::recheck(uint64_t row, int64_t id) {
  const size_t dim = rows_.d();
  const std::string vec(reinterpret_cast<const char*>(rows_.row(row)), dim * sizeof(float));
  // An exhaustive search: efSearch above any index this tool meets reaches every node the
  // graph can reach from its entry point.
  pb::SearchRequest req;
  req.set_dim(static_cast<uint32_t>(dim));
  req.set_k(1);
  req.set_ef_search(kExhaustiveEf);
  req.set_probe(o_.insert_verify_probe);
  req.set_vectors(vec);
  pb::SearchResponse resp;
  grpc::ClientContext ctx;
  prepare(ctx, o_);
  if (const grpc::Status s = stub_->Search(&ctx, req, &resp); !s.ok())
    throw std::runtime_error("verifying the acknowledged inserts: an exhaustive Search failed: " +
                             std::string(code_name(s.error_code())) + ": " + s.error_message());
  if (resp.ids_size() > 0 && resp.ids(0) == id) {
    ++search_misses_;  // the search's recall, not the index's
    ++found_;
    return;
  }
  // Not reachable by search: the id index tells a row it holds (an insert of the id is refused)
  // from one it lost (the insert goes in: the row is in the index again).
  pb::InsertRequest ins;
  ins.set_dim(static_cast<uint32_t>(dim));
  ins.set_vectors(vec);
  ins.add_ids(id);
  pb::InsertResponse ir;
  grpc::ClientContext ictx;
  prepare(ictx, o_);
  const grpc::Status s = stub_->Insert(&ictx, ins, &ir);
  if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT && s.error_message().find("already in the index") != std::string::npos)
    ++unreachable_;
  else
    ++lost_;
  if (missing_ids_.size() < 20) missing_ids_.push_back(id);
}

uint64_t Inserter::error_count() const {
  uint64_t n = 0;
  for (const auto& [code, e] : errors_) n += e.count;
  return n;
}

json Inserter::report() {
  json errors = json::object();
  for (const auto& [code, e] : errors_) errors[code] = {{"count", e.count}, {"first_message", e.first_message}};
  json r = {{"requests", requests_},
            {"rows_acknowledged", acked_.size()},
            {"errors", error_count()},
            {"errors_by_code", errors},
            {"batch", o_.insert_batch},
            {"latency_us", percentiles(latency_us_)}};
  if (verified_)
    r["verify"] = {{"found", found_},
                   {"missing", acked_.size() - found_},
                   {"missing_ids", missing_ids_},
                   {"search_misses", search_misses_},
                   {"unreachable", unreachable_},
                   {"lost", lost_}};
  return r;
}

}  // namespace dmhnsw::serve_bench
