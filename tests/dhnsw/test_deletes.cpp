// d-HNSW deletes and upserts on LocalFabric (compute/dhnsw/insert.hpp, Inserter::remove and
// insert(upsert)): an index built in process over 2 memnodes; 30 % deleted, 10 % upserted,
// new sparse 63-bit ids inserted; queries through the Engine never return a deleted id or an
// upserted id's old vector; every live id is found by itself; unknown ids are reported; an
// online rebuild drops the tombstones, and deletes keep working in the new epoch (whose id
// index the rebuild moved).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/distance.hpp"
#include "common/fabric/local/local_fabric.hpp"
#include "common/region.hpp"
#include "compute/dhnsw/build.hpp"
#include "compute/dhnsw/control.hpp"
#include "compute/dhnsw/epoch.hpp"
#include "compute/dhnsw/insert.hpp"
#include "compute/dhnsw/pipeline.hpp"
#include "tests/dhnsw/local_index.hpp"

using namespace dmhnsw;
using namespace dmhnsw::dhnsw;
using Catch::Contains;
using namespace dmhnsw::dhnsw::testing;


TEST_CASE("dhnsw deletes: delete 30 %, upsert 10 %, insert sparse ids, and a rebuild drops the tombstones",
          "[dhnsw][delete]") {
  std::mt19937_64 rng(5);
  const std::vector<float> data = blobs(kN, 1);
  std::vector<int64_t> ids(kN);
  std::set<int64_t> used;
  for (auto& id : ids) {  // sparse, non-monotone, up to 2^63 - 1
    do id = static_cast<int64_t>(rng() >> 1); while (!used.insert(id).second);
  }
  ids[0] = (int64_t{1} << 62) + ((int64_t{1} << 62) - 1);  // the largest id
  auto cluster = place(data, ids);
  Live live;
  for (size_t i = 0; i < kN; ++i) live[ids[i]] = std::vector<float>(data.begin() + i * kDim, data.begin() + (i + 1) * kDim);

  auto ep = cluster->make_endpoint();
  InsertTuning t;
  t.rebuild_deleted = 0;  // the test rebuilds when it wants
  Inserter ins(*cluster, *ep, 0, t);
  REQUIRE(ins.has_id_index());

  // Delete 30 %, with two unknown ids among them.
  std::vector<int64_t> del(ids.begin() + 1, ids.begin() + 1 + kN * 3 / 10);
  del.push_back(12345);
  del.push_back(ids[1]);  // twice in one request: once
  std::vector<int64_t> missing = ins.remove(del.data(), del.size());
  CHECK(missing == std::vector<int64_t>{12345});
  for (size_t i = 1; i < 1 + kN * 3 / 10; ++i) live.erase(ids[i]);
  CHECK(ins.stats().deleted == kN * 3 / 10);
  // Deleting them again finds none.
  missing = ins.remove(del.data(), 10);
  CHECK(missing.size() == 10);

  // Upsert 10 %: new vectors for live ids (and one absent id, which is inserted).
  const std::vector<float> fresh = blobs(kN / 10 + 1, 2);
  std::vector<int64_t> up(ids.end() - kN / 10, ids.end());
  up.push_back(777);
  ins.insert(fresh.data(), up.data(), up.size(), true);
  for (size_t i = 0; i < up.size(); ++i)
    live[up[i]] = std::vector<float>(fresh.begin() + i * kDim, fresh.begin() + (i + 1) * kDim);
  CHECK(ins.stats().replaced == kN / 10);

  // A plain insert of a held id is refused, naming it, before anything is inserted.
  const std::vector<float> more = blobs(kN / 5, 3);
  std::vector<int64_t> more_ids(kN / 5);
  for (auto& id : more_ids) {
    do id = static_cast<int64_t>(rng() >> 1); while (!used.insert(id).second);
  }
  std::vector<int64_t> clash = more_ids;
  clash.back() = up.front();
  REQUIRE_THROWS_WITH(ins.insert(more.data(), clash.data(), clash.size()), Contains(std::to_string(up.front())));
  // New ids go in (after the deletes, into the same sub-HNSWs' gaps).
  ins.insert(more.data(), more_ids.data(), more_ids.size());
  for (size_t i = 0; i < more_ids.size(); ++i)
    live[more_ids[i]] = std::vector<float>(more.begin() + i * kDim, more.begin() + (i + 1) * kDim);
  check_live(*cluster, live);

  // A rebuild drops what was deleted (and the upserts' old vectors).
  nlohmann::json rr = run_rebuild(*cluster, *ep, 0, RebuildOptions{});
  REQUIRE_FALSE(rr.contains("skipped"));
  uint64_t dropped = rr["deleted_dropped"].get<uint64_t>(), dups = rr["duplicates_dropped"].get<uint64_t>();
  for (const auto& r : ins.stats().rebuild_reports) {  // the inserts' own rebuilds (full gaps)
    dropped += r["deleted_dropped"].get<uint64_t>();
    dups += r["duplicates_dropped"].get<uint64_t>();
  }
  CHECK(dropped == kN * 3 / 10 + kN / 10);
  CHECK(dups == 0);
  {
    Index idx = load_index(*cluster, *ep);
    uint64_t count = 0;
    for (const SubDesc& d : idx.subs) count += d.count;
    CHECK(count == live.size());
  }
  check_live(*cluster, live);

  // In the new epoch: deletes and upserts find their ids through the moved id index.
  Inserter again(*cluster, *ep, 1, t);
  std::vector<int64_t> del2(more_ids.begin(), more_ids.begin() + 50);
  CHECK(again.remove(del2.data(), del2.size()).empty());
  for (int64_t id : del2) live.erase(id);
  std::vector<int64_t> up2{ids[0]};
  again.insert(more.data() + 60 * kDim, up2.data(), 1, true);
  live[ids[0]] = std::vector<float>(more.begin() + 60 * kDim, more.begin() + 61 * kDim);
  CHECK(again.stats().replaced == 1);
  check_live(*cluster, live);
}

TEST_CASE("dhnsw deletes: while a rebuild builds a delete is acknowledged at once and carried into its epoch",
          "[dhnsw][delete][rebuild]") {
  const std::vector<float> data = blobs(kN, 11);
  std::vector<int64_t> ids(kN);
  for (size_t i = 0; i < kN; ++i) ids[i] = static_cast<int64_t>(1000 + 7 * i);
  auto cluster = place(data, ids);
  Live live;
  for (size_t i = 0; i < kN; ++i) live[ids[i]] = std::vector<float>(data.begin() + i * kDim, data.begin() + (i + 1) * kDim);
  auto ep = cluster->make_endpoint();
  InsertTuning t;
  t.rebuild_deleted = 0;
  // 10 % deleted before the rebuild: its snapshot leaves them out.
  {
    Inserter before(*cluster, *ep, 0, t);
    CHECK(before.remove(ids.data(), kN / 10).empty());
    for (size_t i = 0; i < kN / 10; ++i) live.erase(ids[i]);
  }
  const std::vector<float> fresh = blobs(1, 12);
  const int64_t again = ids[kN / 10];  // deleted while the rebuild builds, then inserted anew
  std::vector<int64_t> late(ids.begin() + kN / 2, ids.begin() + kN / 2 + 100);
  std::thread late_deleter;
  uint64_t late_waits = 0;
  std::vector<int64_t> late_missing{-1};

  RebuildOptions ro;
  ro.on_snapshot_written = [&] {
    // The snapshot is taken and the shadow written: 20 % more are deleted now, without waiting.
    auto dep = cluster->make_endpoint();
    Inserter del(*cluster, *dep, 1, t);
    CHECK(del.remove(ids.data() + kN / 10, kN / 5).empty());
    CHECK(del.stats().rebuild_waits == 0);
    CHECK(del.stats().deleted == kN / 5);
    for (size_t i = kN / 10; i < kN / 10 + kN / 5; ++i) live.erase(ids[i]);
    // An id deleted meanwhile can be inserted again: into the insert buffer.
    del.insert(fresh.data(), &again, 1);
    CHECK(del.stats().buffered == 1);
    live[again] = fresh;
    check_live(*cluster, live);  // the live epoch and the buffer: no deleted id answers
  };
  ro.on_deletes_closed = [&] {
    // The master carries the deletes now: a delete from here on waits for the new epoch.
    late_deleter = std::thread([&] {
      auto lep = cluster->make_endpoint();
      Inserter del(*cluster, *lep, 2, t);
      late_missing = del.remove(late.data(), late.size());
      late_waits = del.stats().rebuild_waits;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
  const nlohmann::json rr = run_rebuild(*cluster, *ep, 0, ro);
  late_deleter.join();
  for (int64_t id : late) live.erase(id);
  REQUIRE_FALSE(rr.contains("skipped"));
  CHECK(rr["deleted_dropped"].get<uint64_t>() == kN / 10);
  CHECK(rr["deletes_carried"].get<uint64_t>() == kN / 5);
  CHECK(rr["merged"].get<uint64_t>() == 1);  // the id inserted again after its delete
  CHECK(late_missing.empty());
  CHECK(late_waits == 1);
  {
    Index idx = load_index(*cluster, *ep);
    uint64_t count = 0, deleted = 0;
    for (const SubDesc& s : idx.subs) {  // the live descriptors (the block's copies on other memnodes are not)
      SubDesc d;
      ep->read(RemotePtr(s.memnode, live_desc_offset(idx.header, s.id)), &d, sizeof d);
      count += d.count, deleted += d.deleted;
    }
    CHECK(count - deleted == live.size());
    CHECK(deleted == kN / 5 + late.size());
  }
  check_live(*cluster, live);
  // The carried deletes left the new epoch's id index too: deleting them again finds none.
  Inserter after(*cluster, *ep, 3, t);
  std::vector<int64_t> carried(ids.begin() + kN / 10 + 1, ids.begin() + kN / 10 + kN / 5);
  CHECK(after.remove(carried.data(), carried.size()).size() == carried.size());
  CHECK(after.remove(&again, 1).empty());  // the new vector of the id inserted again is there
}

TEST_CASE("dhnsw in place: searches beside an inserter's commits answer only ids that are there, and see its inserts",
          "[dhnsw][delete][in_place]") {
  const std::vector<float> data = blobs(kN, 21);
  std::vector<int64_t> ids(kN);
  for (size_t i = 0; i < kN; ++i) ids[i] = static_cast<int64_t>(i);
  auto cluster = place(data, ids);
  // New vectors far from the built ones, inserted while the searches run: internal gaps first,
  // then overflow records (copied out of the mapping by a search), with commits moving the
  // versions under the searches.
  constexpr size_t kNew = 900;
  std::vector<float> fresh = blobs(kNew, 22);
  for (float& x : fresh) x += 40.f;
  std::vector<int64_t> fresh_ids(kNew);
  for (size_t i = 0; i < kNew; ++i) fresh_ids[i] = static_cast<int64_t>(1'000'000 + i);
  std::atomic<bool> done{false};
  std::thread inserter([&] {
    auto ep = cluster->make_endpoint();
    InsertTuning t;
    t.rebuild_deleted = 0;
    Inserter ins(*cluster, *ep, 1, t);
    for (size_t i = 0; i < kNew; i += 30) ins.insert(fresh.data() + i * kDim, fresh_ids.data() + i, 30);
    done.store(true);
  });
  uint64_t in_place = 0, copies = 0, retries = 0;
  size_t bad = 0, wrong = 0, rounds = 0;
  // Each answer's distance is the distance to its id's vector: a search that took a torn
  // block would pair a label with another record's vector.
  auto vector_of = [&](int64_t id) -> const float* {
    if (id >= 0 && id < int64_t{kN}) return data.data() + static_cast<size_t>(id) * kDim;
    if (id >= 1'000'000 && id < 1'000'000 + int64_t{kNew}) return fresh.data() + static_cast<size_t>(id - 1'000'000) * kDim;
    return nullptr;
  };
  do {
    const bool last = done.load();
    auto ep = cluster->make_endpoint();
    Index idx = load_index(*cluster, *ep);
    EngineOptions o;
    o.batch = 50;
    o.probe = kP;
    o.ef_search = 32;
    o.cache_subs = 0;
    std::vector<Answer> a;
    const RunStats rs = Engine(*cluster, idx, o).run(fresh.data(), 200, a);
    for (const auto& b : rs.batches) {
      in_place += b.in_place;
      copies += b.in_place_copies;
      retries += b.in_place_retries;
    }
    for (size_t q = 0; q < a.size(); ++q)
      for (const auto& [d, id] : a[q]) {
        const float* v = vector_of(id);
        if (v == nullptr) {
          ++bad;
          continue;
        }
        const float t = reference_distance(Metric::L2, fresh.data() + q * kDim, v, kDim);
        wrong += std::abs(t - d) > 1e-3f * std::max(1.f, t);
      }
    ++rounds;
    if (last) {  // every insert acknowledged: each of the first 200 finds itself
      size_t self = 0;
      for (size_t q = 0; q < 200; ++q) self += !a[q].empty() && a[q][0].second == fresh_ids[q];
      CHECK(self >= 198);
      break;
    }
  } while (true);
  inserter.join();
  INFO(rounds << " rounds: " << in_place << " in place, " << copies << " copied, " << retries << " retried");
  CHECK(bad == 0);
  CHECK(wrong == 0);
  CHECK((in_place > 0) == kLocalMaps);
  CHECK((copies > 0) == kLocalMaps);  // the inserts' overflow records: copied out of the mapping, deserialized
}

TEST_CASE("dhnsw in place: a run across an epoch move answers from both epochs and acknowledges the new one",
          "[dhnsw][delete][in_place][rebuild]") {
  const std::vector<float> data = blobs(kN, 31);
  std::vector<int64_t> ids(kN);
  for (size_t i = 0; i < kN; ++i) ids[i] = static_cast<int64_t>(5000 + i);
  auto cluster = place(data, ids);
  auto ep = cluster->make_endpoint();
  Index idx = load_index(*cluster, *ep);
  EngineOptions o;
  o.batch = 10;  // many batches per run: the rebuild publishes between two of them
  o.probe = kP;  // every partition: each vector finds itself
  o.ef_search = 32;
  o.cache_subs = 0;
  o.ack_slot = 1;  // acknowledges epochs: the rebuild master waits for it
  Engine engine(*cluster, idx, o);
  std::atomic<bool> rebuilt{false};
  nlohmann::json rr;
  std::thread master([&] {
    auto mep = cluster->make_endpoint();
    rr = run_rebuild(*cluster, *mep, 0, RebuildOptions{});
    rebuilt.store(true);
  });
  std::set<uint64_t> epochs;
  size_t wrong = 0, self = 0, asked = 0;
  for (int round = 0; round < 200 && (!rebuilt.load() || epochs.size() < 2); ++round) {
    std::vector<Answer> a;
    const RunStats rs = engine.run(data.data(), 300, a);
    for (const auto& b : rs.batches) epochs.insert(b.epoch);
    for (size_t q = 0; q < a.size(); ++q) {
      ++asked;
      self += !a[q].empty() && a[q][0].second == ids[q];
      for (const auto& [d, id] : a[q]) {
        const size_t i = static_cast<size_t>(id - 5000);
        if (id < 5000 || i >= kN) {
          ++wrong;
          continue;
        }
        const float t = reference_distance(Metric::L2, data.data() + q * kDim, data.data() + i * kDim, kDim);
        wrong += std::abs(t - d) > 1e-3f * std::max(1.f, t);
      }
    }
  }
  master.join();
  REQUIRE_FALSE(rr.contains("skipped"));
  CHECK(ack_epoch(read_control(*ep).acks[1]) == rr["epoch"].get<uint64_t>());  // the engine acknowledged the new epoch
  CHECK(epochs.size() >= 2);            // its batches were planned with both
  CHECK(wrong == 0);
  CHECK(static_cast<double>(self) >= 0.99 * static_cast<double>(asked));
}
