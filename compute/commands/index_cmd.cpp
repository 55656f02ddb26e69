// `build`, `insert` and `rebuild`: their flags and runs. shine builds and inserts through
// shine::run_build; dhnsw through its online build, in-place inserts and epoch rebuild.
#include <cstdio>

#include "common/dataset.hpp"
#include "common/units.hpp"
#include "compute/commands/commands.hpp"
#include "compute/dhnsw/boundary.hpp"
#include "compute/store.hpp"

namespace dmhnsw::commands {

void IndexCommands::add(CLI::App& app) {
  build_ = app.add_subcommand("build", "format the memnodes for an index (the first computenode to arrive "
                                       "does it) and insert this computenode's share of --data (rows i with "
                                       "i % num-cns == cn-id)");
  insert_ = app.add_subcommand("insert", "insert rows [--begin, --end) of --data into an existing index "
                                         "(this computenode's share of them), while others may query");
  upsert_ = app.add_subcommand("upsert", "rows [--begin, --end) of --data under the ids of --ids: an id the "
                                         "index holds gets the row's vector (its old one is deleted once the new one "
                                         "is in), a new id is inserted");
  delete_ = app.add_subcommand("delete", "delete the ids of --ids (this computenode's share of them); an id "
                                         "not in the index is reported, not an error");
  delete_->add_option("--ids", ids_file_, "ids, one decimal number per line")->required();
  delete_->add_option("--threads", del_.threads, "worker threads (each with its own endpoint)")->capture_default_str();
  delete_->add_option("--coroutines", del_.coroutines, "deletes in flight per thread")->capture_default_str();
  delete_->add_option("--report", report_, "write the delete report (JSON) here (computenode 0, merged)");
  consolidate_ = app.add_subcommand("consolidate", "shine: replace every live node's edges to deleted nodes by "
                                                   "their live neighbours (FreshDiskANN's consolidation), so that "
                                                   "inserts reusing deleted records leave no stale edge (this "
                                                   "computenode's share of the nodes)");
  consolidate_->add_option("--threads", con_.threads, "worker threads (each with its own endpoint)")->capture_default_str();
  consolidate_->add_option("--coroutines", con_.coroutines, "nodes in flight per thread")->capture_default_str();
  consolidate_->add_option("--alpha", con_.alpha,
                           "RobustPrune's alpha for the rewritten lists: a candidate is dropped when a kept one is "
                           "nearer to it than its distance over alpha (1: hnswlib's heuristic)")
      ->capture_default_str()
      ->check(CLI::Range(1.0f, 2.0f));
  consolidate_->add_option("--report", report_, "write the consolidation report (JSON) here (computenode 0, merged)");
  for (auto* sc : {build_, insert_, upsert_}) {
    sc->add_option("--data", bo_.data, "base vectors (.fvecs .bvecs .fbin .u8bin .i8bin); labels are row ids "
                                       "unless --ids")->required();
    sc->add_option("--ids", ids_file_, "the rows' ids, one decimal number (0 .. 2^63-1) per line, row i's on "
                                       "line i (shine: needs an id index)");
    sc->add_option("--max-elements", bo_.max_elements, "use only the first N rows (0 = all)")->capture_default_str();
    sc->add_option("--threads", bo_.threads, "worker threads (each with its own endpoint)")->capture_default_str();
    sc->add_option("--coroutines", bo_.coroutines, "inserts in flight per thread")->capture_default_str();
    sc->add_flag("--in-place,!--no-in-place", bo_.in_place,
                 "shine: where the provider maps the memnodes' regions into this process (cxl), the inserts' searches "
                 "read neighbour lists and vectors where they lie (--no-in-place: copy them out by READs)")
        ->capture_default_str();
    sc->add_option("--report", report_,
                   "write the build report (JSON) here (shine: computenode 0, merged; dhnsw: each computenode, "
                   "PATH.cn<id> when --num-cns > 1)");
    sc->add_option("--build-cache", build_cache_, "memory for vectors read while inserting (they never change), e.g. 2GiB")
        ->capture_default_str();
  }
  build_->add_option("--m", bo_.params.m, "HNSW M: neighbours per node on upper levels (2M on level 0)")->capture_default_str();
  build_->add_option("--ef-construction", bo_.params.ef_construction, "HNSW efConstruction")->capture_default_str();
  build_->add_option("--metric", metric_, "l2 or ip")->capture_default_str()->check(CLI::IsMember({"l2", "ip"}));
  build_->add_option("--seed", bo_.params.seed, "seed of levels and memnode choice")->capture_default_str();
  build_->add_option("--id-capacity", id_capacity_,
                     "shine: an id index for this many ids in the memnodes' regions (any ids, deletes, upserts; an "
                     "insert of an id it holds is refused naming it); -1: twice the rows (at least 1024); 0: none "
                     "(inserts then take only ids above the index's highest)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 40));
  build_->add_option("--codes", codes_,
                     "compressed vectors stored with the index (searched with --rerank): none, sq8 (8 bits per "
                     "dimension, Faiss's ScalarQuantizer) or pq:M (M bytes, Faiss's ProductQuantizer; M divides the "
                     "dimension), trained on up to 65,536 rows (shine: of the computenode that formats; dhnsw: spread "
                     "over the data; a rebuild keeps the quantizer)")
      ->capture_default_str();
  build_->add_option("--codes-capacity", bo_.params.codes_capacity,
                     "shine: codes log entries per memnode (0: twice the rows over the memnodes, at least 1024)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40));
  build_->add_option("--store-index", store_dir_,
                     "after the build, store the index as `snapshot --dir DIR` does: every memnode writes its region "
                     "to DIR/memnode-<id>.img");
  // d-HNSW build (as tools/dhnsw-build) and insert options
  build_->add_option("--partitions", dbo_.build.partitions, "dhnsw: partitions / sub-HNSWs (0: round(sqrt(n)))")
      ->capture_default_str();
  build_->add_option("--meta-m", dbo_.build.meta_m, "dhnsw: HNSW M of the meta-HNSW")->capture_default_str();
  build_->add_option("--internal-gap", dbo_.build.layout.internal_gap,
                     "dhnsw: internal gap after each array of a sub-HNSW, share of it (0..1000)")
      ->capture_default_str();
  build_->add_option("--overflow-gap", dbo_.build.layout.overflow_gap,
                     "dhnsw: shared overflow gap of a group, share of its two blocks (0..1000)")
      ->capture_default_str();
  dhnsw::add_boundary_flags(*build_, dbo_.build.boundary, "dhnsw: ");
  build_->add_option("--partition-metric", partition_metric_, "dhnsw: l2 or ip, metric of the partitioning and meta-HNSW")
      ->capture_default_str()
      ->check(CLI::IsMember({"l2", "ip"}));
  insert_->add_option("--id-offset", dio_.id_offset, "dhnsw: a row's id is this plus its row number")->capture_default_str();
  for (auto* sc : {insert_, upsert_}) {
    sc->add_option("--batch", dio_.batch, "dhnsw: vectors routed and committed together")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    sc->add_option("--share", share_,
                   "dhnsw: I/K: take rows i with i % K == I (default: cn-id/num-cns), so that K computenodes split "
                   "the rows while others query");
  }
  for (auto* sc : {insert_, upsert_, delete_})
    sc->add_option("--lease-ms", dio_.tuning.lease_ms,
                   "dhnsw: a group lock word unchanged this long is taken over (its holder is presumed dead)")
        ->capture_default_str()
        ->check(CLI::Range(10u, 600000u));
  upsert_->get_option("--ids")->required();
  for (auto* sc : {insert_, upsert_}) {
    sc->add_option("--begin", bo_.begin, "first row to insert")->capture_default_str();
    sc->add_option("--end", bo_.end, "one past the last row (0 = all)")->capture_default_str();
  }

  snapshot_ = app.add_subcommand("snapshot", "store the live index: every memnode writes its region to "
                                             "DIR/memnode-<id>.img (memnode --load serves it) while writers pause "
                                             "(searches go on); the images hold every write acknowledged before it "
                                             "began (docs/operations.md, \"Snapshots\")");
  snapshot_->add_option("--dir", store_dir_, "directory on each memnode's host, inside its --store-dir")->required();
  snapshot_->add_option("--wait-seconds", wait_s_,
                        "wait this long for every writing process to pause (a rebuild, delete or consolidation run "
                        "pauses when it finishes)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  rebuild_ = app.add_subcommand("rebuild", "dhnsw: an online rebuild now (paper section 4.5): re-partition "
                                           "and rebuild into a shadow area while others insert and query, publish "
                                           "the next epoch, merge the insert buffer");
  rebuild_->add_option("--lease-ms", dro_.lease_ms, "a master word unchanged this long is taken over")
      ->capture_default_str()
      ->check(CLI::Range(100u, 600000u));
  rebuild_->add_option("--threads", dro_.threads, "build threads (0: every core)")->capture_default_str();
  rebuild_->add_option("--report", report_, "write the rebuild report (JSON) here");
}

void IndexCommands::add_read_mode(std::string& read_mode) {
  for (auto* sc : {build_, insert_, upsert_})
    sc->add_option("--read-mode", read_mode, "batch: a candidate's neighbours in one doorbell; per-read: one READ each")
        ->capture_default_str()
        ->check(CLI::IsMember({"batch", "per-read"}));
}

int IndexCommands::run(RunEnv& env, shine::ReadMode rm) {
  if (*rebuild_) return run_rebuild(env);
  if (*snapshot_) return run_snapshot(env, store_dir_, wait_s_);
  if (env.flags.mode == "dhnsw" && *consolidate_)
    throw std::invalid_argument("consolidate: only --mode shine; d-HNSW's rebuild drops deleted vectors");
  if (env.flags.mode == "dhnsw") return run_dhnsw(env);
  if (*consolidate_) {
    auto r = shine::run_consolidate(env.rc, con_);
    if (env.flags.cn_id == 0) shine::print_consolidate(r);
    env.write_report(report_, r);
    return 0;
  }
  if (*delete_) {
    del_.ids = load_id_list(ids_file_);
    auto r = shine::run_delete(env.rc, del_);
    if (env.flags.cn_id == 0) shine::print_delete(r);
    env.write_report(report_, r);
    return 0;
  }
  return run_shine(env, rm);
}

int IndexCommands::run_snapshot(RunEnv& env, const std::string& dir, int wait_s) {
  const compute::SnapshotResult r = compute::snapshot_index(env.cluster, dir, wait_s * 1000);
  uint64_t bytes = 0;
  for (const auto& i : r.images) bytes += i.file_bytes;
  std::printf("snapshot: %zu image(s), %llu bytes in %s; writers (%u) paused %.3f s to reach a pause, then %.2f s "
              "while storing\n",
              r.images.size(), static_cast<unsigned long long>(bytes), dir.c_str(), r.pause.writers - r.pause.dead,
              r.pause.wait_s, r.store_seconds);
  return 0;
}

int IndexCommands::run_rebuild(RunEnv& env) {
  if (env.flags.mode != "dhnsw") throw std::invalid_argument("rebuild: only --mode dhnsw has epochs");
  auto ep = env.cluster.make_endpoint(64u << 20);
  compute::WriteGate gate(env.cluster);
  compute::WriteGate::Pass pass(gate);  // a snapshot waits for the whole rebuild
  auto r = dhnsw::run_rebuild(env.cluster, *ep, env.flags.cn_id, dro_);
  if (r.contains("skipped")) {
    std::printf("dhnsw rebuild: another computenode is the rebuild master; nothing done\n");
  } else {
    std::printf("dhnsw rebuild: epoch %llu live, %llu vectors, %llu buffered inserts merged, %.2f s\n",
                static_cast<unsigned long long>(r.value("epoch", uint64_t{0})),
                static_cast<unsigned long long>(r.value("vectors", uint64_t{0})),
                static_cast<unsigned long long>(r.value("merged", uint64_t{0})), r.value("seconds_total", 0.0));
  }
  env.write_report(report_, r);
  return 0;
}

// --share I/K, default this computenode's id of --num-cns.
static void parse_share(const std::string& share, dhnsw::InsertOptions& dio) {
  if (share.empty()) return;
  const auto slash = share.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no /");
    dio.share_index = static_cast<uint32_t>(std::stoul(share.substr(0, slash)));
    dio.share_count = static_cast<uint32_t>(std::stoul(share.substr(slash + 1)));
  } catch (const std::exception&) {
    throw std::invalid_argument("--share '" + share + "': want I/K, e.g. 0/2");
  }
  if (dio.share_count == 0 || dio.share_index >= dio.share_count)
    throw std::invalid_argument("--share '" + share + "': I must be below K");
}

int IndexCommands::run_dhnsw(RunEnv& env) {
  const uint32_t cn_id = env.flags.cn_id, num_cns = env.flags.num_cns;
  const compute::RunContext& rc = env.rc;  // with the departures read at connect (Board)
  std::string path = report_;
  if (!path.empty() && num_cns > 1) path += ".cn" + std::to_string(cn_id);  // one file per process
  std::vector<int64_t> ids;
  if (!ids_file_.empty())
    for (uint64_t id : load_id_list(ids_file_)) ids.push_back(static_cast<int64_t>(id));  // 0 .. 2^63 - 1
  if (*delete_) {
    dhnsw::DeleteOptions d;
    d.ids = std::move(ids);
    d.tuning = dio_.tuning;
    auto r = dhnsw::run_delete(rc, d);
    dhnsw::print_delete(r);
    env.write_report(path, r, true);
    return 0;
  }
  if (*build_) {
    dbo_.ids = std::move(ids);
    dbo_.data = bo_.data;
    dbo_.max_vectors = bo_.max_elements;
    dbo_.metric = parse_metric(metric_);
    dbo_.build.codes = compute::parse_codes(codes_);
    dbo_.build.partition_metric = parse_metric(partition_metric_);
    if (build_->get_option("--m")->count() > 0) dbo_.build.m = bo_.params.m;
    if (build_->get_option("--ef-construction")->count() > 0) dbo_.build.ef_construction = bo_.params.ef_construction;
    if (build_->get_option("--seed")->count() > 0) dbo_.build.seed = bo_.params.seed;
    if (build_->get_option("--threads")->count() > 0) dbo_.build.threads = bo_.threads;
    auto r = dhnsw::run_online_build(rc, dbo_);
    if (!r.contains("skipped"))
      std::printf("dhnsw build: %llu vectors in %u partitions; wrote %llu bytes in %llu WRITEs, %llu doorbells, "
                  "%.2f s\n", static_cast<unsigned long long>(r["vectors"].get<uint64_t>()),
                  r["options"]["partitions"].get<unsigned>(),
                  static_cast<unsigned long long>(r["write"]["bytes"].get<uint64_t>()),
                  static_cast<unsigned long long>(r["write"]["writes"].get<uint64_t>()),
                  static_cast<unsigned long long>(r["write"]["doorbells"].get<uint64_t>()),
                  r["write"]["seconds"].get<double>());
    env.write_report(path, r, true);
    if (!store_dir_.empty() && cn_id == 0) run_snapshot(env, store_dir_, wait_s_);
    return 0;
  }
  dio_.data = bo_.data;
  dio_.share_index = cn_id;
  dio_.share_count = num_cns;
  parse_share(share_, dio_);
  dio_.begin = bo_.begin;
  dio_.end = bo_.end;
  dio_.ids = std::move(ids);
  dio_.upsert = static_cast<bool>(*upsert_);
  auto r = dhnsw::run_insert(rc, dio_);
  dhnsw::print_insert(r);
  env.write_report(path, r, true);
  return 0;
}

int IndexCommands::run_shine(RunEnv& env, shine::ReadMode rm) {
  bo_.params.metric = parse_metric(metric_);
  bo_.mode = rm;
  bo_.format = static_cast<bool>(*build_);
  bo_.upsert = static_cast<bool>(*upsert_);
  bo_.cache_bytes = parse_bytes(build_cache_, "--build-cache");
  if (!ids_file_.empty()) bo_.ids = load_id_list(ids_file_);
  if (*build_) {  // an id index by default: twice the rows (or the ids), room for as many inserts
    uint64_t rows = 0;
    try {
      rows = probe(bo_.data).n;
    } catch (const std::exception& e) {
      throw std::invalid_argument("--data: " + std::string(e.what()));
    }
    if (bo_.max_elements > 0) rows = std::min<uint64_t>(rows, bo_.max_elements);
    rows = std::max<uint64_t>(rows, bo_.ids.size());
    bo_.params.id_capacity = id_capacity_ >= 0 ? static_cast<uint64_t>(id_capacity_) : std::max<uint64_t>(1024, 2 * rows);
    bo_.codes = compute::parse_codes(codes_);
    if (bo_.params.codes_capacity == 0)
      bo_.params.codes_capacity = std::max<uint64_t>(1024, 2 * rows / std::max<size_t>(1, env.cluster.memnodes().size()));
  }
  auto r = shine::run_build(env.rc, bo_);
  if (env.flags.cn_id == 0) shine::print_build(r);
  env.write_report(report_, r);
  if (!store_dir_.empty() && env.flags.cn_id == 0) run_snapshot(env, store_dir_, wait_s_);
  return 0;
}

}  // namespace dmhnsw::commands
