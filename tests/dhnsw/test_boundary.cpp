// d-HNSW boundary copies (compute/dhnsw/boundary.hpp) on LocalFabric: recall at a fixed probe
// rises on overlapping clusters; inserts place copies and map them in the id index; deletes and
// upserts reach every copy, also across an online rebuild and while one builds; answers never
// list an id twice.
#include <catch2/catch.hpp>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <thread>
#include <cstring>
#include <numeric>
#include <set>
#include <unordered_map>

#include "compute/coro.hpp"
#include "compute/dhnsw/boundary.hpp"
#include "compute/dhnsw/build.hpp"
#include "compute/dhnsw/epoch.hpp"
#include "compute/dhnsw/insert.hpp"
#include "compute/id_index.hpp"
#include "tests/dhnsw/local_index.hpp"

using namespace dmhnsw;
using namespace dmhnsw::dhnsw;
using namespace dmhnsw::dhnsw::testing;

namespace {

/// recall@10 of `a` against brute force over `data`.
double recall10(const std::vector<float>& data, const std::vector<float>& q, const std::vector<Answer>& a) {
  const size_t n = data.size() / kDim, nq = q.size() / kDim;
  size_t hit = 0;
  for (size_t i = 0; i < nq; ++i) {
    std::vector<std::pair<float, int64_t>> d(n);
    for (size_t j = 0; j < n; ++j) {
      float t = 0;
      for (uint32_t k = 0; k < kDim; ++k) t += (q[i * kDim + k] - data[j * kDim + k]) * (q[i * kDim + k] - data[j * kDim + k]);
      d[j] = {t, static_cast<int64_t>(j)};
    }
    std::partial_sort(d.begin(), d.begin() + 10, d.end());
    std::set<int64_t> truth;
    for (size_t j = 0; j < 10; ++j) truth.insert(d[j].second);
    for (const auto& [dist, id] : a[i]) hit += truth.count(id);
  }
  return static_cast<double>(hit) / (10.0 * static_cast<double>(nq));
}

/// How many of copy keys 0 .. kMaxCopies-1 of `id` the live epoch's id index maps.
size_t keys_of(fabric::Cluster& c, int64_t id) {
  auto ep = c.make_endpoint();
  const Index idx = load_index(c, *ep);
  compute::Scheduler s(*ep);
  IdIndex x(id_table(idx.header), 0, s, 1);
  size_t n = 0;
  for (unsigned k = 0; k < kMaxCopies; ++k)
    n += !compute::run_sync(s, x.find(IdKey::copy_of(static_cast<uint64_t>(id), k))).is_null();
  return n;
}

/// The id index's keys of every id in `live`, in all (each copy of an id counts).
uint64_t keys_of_all(fabric::Cluster& c, const Live& live) {
  auto ep = c.make_endpoint();
  const Index idx = load_index(c, *ep);
  compute::Scheduler s(*ep);
  IdIndex x(id_table(idx.header), 0, s, 1);
  uint64_t n = 0;
  for (const auto& [id, v] : live)
    for (unsigned k = 0; k < kMaxCopies; ++k)
      n += !compute::run_sync(s, x.find(IdKey::copy_of(static_cast<uint64_t>(id), k))).is_null();
  return n;
}

uint64_t live_entries(fabric::Cluster& c) {  // label entries not marked deleted, copies included
  auto ep = c.make_endpoint();
  const Index idx = load_index(c, *ep);
  uint64_t n = 0;
  for (const SubDesc& s : idx.subs) {
    SubDesc d;
    ep->read(RemotePtr(s.memnode, live_desc_offset(idx.header, s.id)), &d, sizeof d);
    n += d.count - d.deleted;
  }
  return n;
}

}  // namespace

TEST_CASE("dhnsw boundary copies: recall at a fixed probe rises on overlapping clusters, at a reported cost",
          "[dhnsw][boundary]") {
  const std::vector<float> data = blobs(kN, 21, 1.5f);  // clusters that overlap
  const std::vector<float> q = blobs(200, 22, 1.5f);
  std::vector<int64_t> ids(kN);
  std::iota(ids.begin(), ids.end(), 0);
  BoundaryRule rule;
  rule.ratio = 1.3;
  rule.max_copies = 4;
  double r[2];
  for (int with = 0; with < 2; ++with) {
    auto c = place(data, ids, with ? rule : BoundaryRule{});
    r[with] = recall10(data, q, search(*c, q, 1));
  }
  INFO("recall@10 at probe 1 of " << kP << ": " << r[0] << " without copies, " << r[1] << " with");
  CHECK(r[1] >= r[0] + 0.05);

  BuildOptions bo;
  bo.partitions = kP;
  bo.m = 12;
  bo.ef_construction = 60;
  bo.boundary = rule;
  const BuiltIndex b = build_index(data.data(), kN, kDim, Metric::L2, bo);
  const nlohmann::json j = b.report();
  CHECK(b.copies > 0);
  CHECK(b.copies <= uint64_t{kN} * (rule.max_copies - 1));
  CHECK(j["boundary"]["copies"].get<uint64_t>() == b.copies);
  CHECK(j["boundary"]["partitions_per_vector"].get<double>() == Approx(1.0 + static_cast<double>(b.copies) / kN));
  CHECK(j["boundary"]["copy_bytes"].get<uint64_t>() == b.copies * (4 * kDim + 8 + 8 * bo.m));
  uint64_t held = 0;
  for (uint64_t s : b.partition_sizes) held += s;
  CHECK(held == kN + b.copies);
  CHECK(b.header.max_copies == 4);
  CHECK(b.header.boundary_ratio_ppm == 1300000);

  // Bad rules are refused naming the flag.
  bo.boundary.ratio = 0.5;
  CHECK_THROWS_WITH(build_index(data.data(), kN, kDim, Metric::L2, bo), Catch::Contains("--boundary-ratio"));
  bo.boundary.ratio = 1.3;
  bo.boundary.max_copies = kMaxCopies + 1;
  CHECK_THROWS_WITH(build_index(data.data(), kN, kDim, Metric::L2, bo), Catch::Contains("--max-copies"));
  bo.boundary.max_copies = 4;
  bo.partition_metric = Metric::IP;
  CHECK_THROWS_WITH(build_index(data.data(), kN, kDim, Metric::L2, bo), Catch::Contains("--partition-metric l2"));
}

TEST_CASE("dhnsw boundary copies: inserts, upserts and deletes reach every copy, across and during a rebuild",
          "[dhnsw][boundary][delete][rebuild]") {
  const std::vector<float> data = blobs(kN, 31, 1.5f);
  std::vector<int64_t> ids(kN);
  for (size_t i = 0; i < kN; ++i) ids[i] = static_cast<int64_t>(5000 + 3 * i);
  BoundaryRule rule;
  rule.ratio = 1.3;
  rule.max_copies = 4;
  auto cluster = place(data, ids, rule);
  Live live;
  for (size_t i = 0; i < kN; ++i) live[ids[i]] = std::vector<float>(data.begin() + i * kDim, data.begin() + (i + 1) * kDim);
  size_t with_copies = 0;
  for (size_t i = 0; i < 200; ++i) with_copies += keys_of(*cluster, ids[i]) > 1;
  CHECK(with_copies > 20);  // the build mapped the copies
  CHECK(live_entries(*cluster) > live.size());
  CHECK(live_entries(*cluster) == keys_of_all(*cluster, live));  // every live copy mapped, no dead one

  auto ep = cluster->make_endpoint();
  InsertTuning t;
  t.rebuild_deleted = 0;
  Inserter ins(*cluster, *ep, 0, t);
  // Inserts place copies too, and map each.
  const std::vector<float> more = blobs(300, 32, 1.5f);
  std::vector<int64_t> more_ids(300);
  for (size_t i = 0; i < 300; ++i) more_ids[i] = static_cast<int64_t>(1'000'000 + i);
  ins.insert(more.data(), more_ids.data(), more_ids.size());
  for (size_t i = 0; i < 300; ++i) live[more_ids[i]] = std::vector<float>(more.begin() + i * kDim, more.begin() + (i + 1) * kDim);
  size_t inserted_copies = 0;
  for (int64_t id : more_ids) inserted_copies += keys_of(*cluster, id) - 1;
  CHECK(inserted_copies > 30);
  CHECK(ins.stats().inserted == 300);
  CHECK(ins.stats().copies == inserted_copies);
  check_live(*cluster, live);

  // Deletes: every copy is marked and unmapped (of built and of inserted vectors alike).
  std::vector<int64_t> del(ids.begin(), ids.begin() + 400);
  del.insert(del.end(), more_ids.begin(), more_ids.begin() + 100);
  CHECK(ins.remove(del.data(), del.size()).empty());
  for (int64_t id : del) {
    live.erase(id);
    CHECK(keys_of(*cluster, id) == 0);
  }
  CHECK(ins.remove(del.data(), 10).size() == 10);  // gone: not found again
  // Upserts: the old vector's copies all go, also those beyond the new vector's.
  const std::vector<float> fresh = blobs(200, 33, 1.5f);
  std::vector<int64_t> up(ids.begin() + 1000, ids.begin() + 1200);
  ins.insert(fresh.data(), up.data(), up.size(), true);
  for (size_t i = 0; i < up.size(); ++i) live[up[i]] = std::vector<float>(fresh.begin() + i * kDim, fresh.begin() + (i + 1) * kDim);
  CHECK(ins.stats().replaced == up.size());
  check_live(*cluster, live);
  CHECK(live_entries(*cluster) > live.size());
  CHECK(live_entries(*cluster) == keys_of_all(*cluster, live));  // every live copy mapped, no dead one

  // A rebuild keeps one vector per id and places its copies anew; deletes while it builds are
  // carried into every copy of the new epoch.
  std::vector<int64_t> late(ids.begin() + 2000, ids.begin() + 2100);
  RebuildOptions ro;
  ro.on_snapshot_written = [&] {
    auto dep = cluster->make_endpoint();
    Inserter del2(*cluster, *dep, 1, t);
    CHECK(del2.remove(late.data(), late.size()).empty());
  };
  const nlohmann::json rr = run_rebuild(*cluster, *ep, 0, ro);
  REQUIRE_FALSE(rr.contains("skipped"));
  for (int64_t id : late) live.erase(id);
  CHECK(rr["copies_dropped"].get<uint64_t>() > 0);
  CHECK(rr["copies"].get<uint64_t>() > 0);
  CHECK(rr["duplicates_dropped"].get<uint64_t>() == 0);
  CHECK(rr["deletes_carried"].get<uint64_t>() == late.size());
  for (size_t i = 0; i < 20; ++i) CHECK(keys_of(*cluster, late[i]) == 0);
  check_live(*cluster, live);
  CHECK(live_entries(*cluster) > live.size());
  CHECK(live_entries(*cluster) == keys_of_all(*cluster, live));  // every live copy mapped, no dead one

  // In the new epoch, a delete finds every copy through the rebuilt id index.
  Inserter after(*cluster, *ep, 2, t);
  std::vector<int64_t> del3(ids.begin() + 2500, ids.begin() + 2600);
  CHECK(after.remove(del3.data(), del3.size()).empty());
  for (int64_t id : del3) {
    live.erase(id);
    CHECK(keys_of(*cluster, id) == 0);
  }
  check_live(*cluster, live);
}

TEST_CASE("dhnsw --probe-ratio: a query searches those of its top b partitions nearly as close as its nearest",
          "[dhnsw][boundary]") {
  const std::vector<float> data = blobs(kN, 41, 1.5f);
  const std::vector<float> q = blobs(200, 42, 1.5f);
  std::vector<int64_t> ids(kN);
  std::iota(ids.begin(), ids.end(), 0);
  auto c = place(data, ids);
  auto ep = c->make_endpoint();
  const Index idx = load_index(*c, *ep);
  auto run = [&](double ratio, std::vector<Answer>& a) {
    EngineOptions o;
    o.batch = 64;
    o.probe = kP;
    o.probe_ratio = ratio;
    o.ef_search = 64;
    o.cache_subs = 0;
    const RunStats rs = Engine(*c, idx, o).run(q.data(), q.size() / kDim, a);
    uint64_t probed = 0;
    for (const BatchStats& b : rs.batches) probed += b.probed;
    return static_cast<double>(probed) / static_cast<double>(q.size() / kDim);
  };
  std::vector<Answer> all, one, some;
  CHECK(run(0, all) == Approx(kP));    // off: every one of the b
  CHECK(run(1.0, one) == Approx(1.0));  // the nearest alone (no ties in random data)
  const double mid = run(1.2, some);
  INFO("partitions per query at ratio 1.2: " << mid << "; recall@10 " << recall10(data, q, one) << " / "
                                             << recall10(data, q, some) << " / " << recall10(data, q, all));
  CHECK(mid > 1.0);
  CHECK(mid < kP);
  CHECK(recall10(data, q, some) >= recall10(data, q, one));
  CHECK(recall10(data, q, all) >= recall10(data, q, some));
}

TEST_CASE("dhnsw boundary copies: deletes racing inserts of the same ids leave no copy of a deleted id",
          "[dhnsw][boundary][delete]") {
  const std::vector<float> data = blobs(kN, 51, 1.5f);
  std::vector<int64_t> ids(kN);
  std::iota(ids.begin(), ids.end(), 0);
  BoundaryRule rule;
  rule.ratio = 1.3;
  rule.max_copies = 4;
  auto cluster = place(data, ids, rule);
  const std::vector<float> more = blobs(400, 52, 1.5f);
  std::vector<int64_t> more_ids(400);
  std::iota(more_ids.begin(), more_ids.end(), 1'000'000);
  InsertTuning t;
  t.rebuild_deleted = 0;
  // Batch by batch, one delete of a batch's ids starts with its insert (each id raced once, and
  // never deleted again: a copy left mapped would stay).
  std::barrier both(2);
  std::thread deleter([&] {
    auto ep = cluster->make_endpoint();
    Inserter del(*cluster, *ep, 1, t);
    for (size_t at = 0; at < more_ids.size(); at += 10) {
      both.arrive_and_wait();
      std::this_thread::sleep_for(std::chrono::microseconds(at % 70 * 20));  // into the insert, more or less
      del.remove(more_ids.data() + at, 10);
    }
  });
  {
    auto ep = cluster->make_endpoint();
    Inserter ins(*cluster, *ep, 0, t);
    for (size_t at = 0; at < more_ids.size(); at += 10) {
      both.arrive_and_wait();
      ins.insert(more.data() + at * kDim, more_ids.data() + at, 10);
    }
  }
  deleter.join();
  // Each new id is either live with its own key mapped, or gone with no key at all.
  Live live;
  for (size_t i = 0; i < kN; ++i) live[ids[i]] = std::vector<float>(data.begin() + i * kDim, data.begin() + (i + 1) * kDim);
  size_t kept = 0;
  for (size_t i = 0; i < more_ids.size(); ++i) {
    const size_t keys = keys_of(*cluster, more_ids[i]);
    auto ep = cluster->make_endpoint();
    const Index idx = load_index(*cluster, *ep);
    compute::Scheduler sc(*ep);
    IdIndex x(id_table(idx.header), 0, sc, 1);
    const bool own = !compute::run_sync(sc, x.find(static_cast<uint64_t>(more_ids[i]))).is_null();
    if (keys > 0) {
      live[more_ids[i]] = std::vector<float>(more.begin() + i * kDim, more.begin() + (i + 1) * kDim);
      ++kept;
    }
    CHECK((keys == 0 || own));
  }
  WARN(kept << " of 400 racing inserts outlived the deletes");
  CHECK(live_entries(*cluster) == keys_of_all(*cluster, live));  // no unmapped live copy, no dead mapped one
  check_live(*cluster, live);
}
