// Writes the seed corpus of every harness (tests/fuzz/corpus/<name>/) with the project's own
// writers, so that the seeds are valid inputs of today's formats: small files (a few KB), each
// prefixed with the harness's option bytes (see each fuzz_<name>.cpp). Not part of the normal
// build (EXCLUDE_FROM_ALL):
//   ninja -C build fuzz_make_seeds && build/bin/fuzz_make_seeds tests/fuzz/corpus
// Deterministic: the same build writes the same bytes (trace headers hold no clock here).
#include <hnswlib/hnswlib.h>  // the only translation unit of this binary that includes it

#include <faiss/IndexHNSW.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "cache/trace.hpp"
#include "common/checksum.hpp"
#include "common/dataset.hpp"
#include "compute/dhnsw/control.hpp"
#include "compute/dhnsw/layout.hpp"
#include "common/fabric/control_wire.hpp"
#include "common/fabric/local/local_fabric.hpp"
#include "common/region.hpp"
#include "common/workload.hpp"
#include "compute/coro.hpp"
#include "compute/dhnsw/subindex.hpp"
#include "compute/shine/graph.hpp"
#include "memory/admin.hpp"
#include "memory/image.hpp"
#include "memory/relay_protocol.hpp"

using namespace dmhnsw;
namespace fs = std::filesystem;

namespace {

fs::path out_root;
fs::path scratch;

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// corpus/<harness>/<name>: the option bytes `prefix`, then `body`.
void seed(const std::string& harness, const std::string& name, std::vector<char> prefix, const std::vector<char>& body) {
  fs::create_directories(out_root / harness);
  prefix.insert(prefix.end(), body.begin(), body.end());
  std::ofstream(out_root / harness / name, std::ios::binary)
      .write(prefix.data(), static_cast<std::streamsize>(prefix.size()));
}

template <class T>
void put(std::vector<char>& b, const T& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}
template <class T>
std::vector<char> bytes_of(const T& v) {
  std::vector<char> b;
  put(b, v);
  return b;
}

std::vector<float> values(size_t n, uint64_t seed, float lo = -1, float hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// ------------------------------------------------------------------------------ dataset
void dataset_seeds() {
  const size_t n = 5, d = 4;
  std::vector<float> f = values(n * d, 1);
  std::vector<float> ints(n * d);
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<float>(i % 100);
  const FloatMatrix fm(n, d, f), im(n, d, ints);
  std::vector<int32_t> idv(n * d);
  for (size_t i = 0; i < idv.size(); ++i) idv[i] = static_cast<int32_t>(i * 3);
  const IdMatrix ids(n, d, idv);
  const FloatMatrix dist(n, d, values(n * d, 2, 0, 10));
  const char* exts[] = {"fvecs", "bvecs", "ivecs", "fbin", "u8bin", "i8bin", "ibin"};
  for (uint8_t fmt = 0; fmt < 7; ++fmt) {
    const std::string path = (scratch / (std::string("seed.") + exts[fmt])).string();
    const std::string ext = exts[fmt];
    if (ext == "ivecs" || ext == "ibin") write_ids(path, ids, ext == "ibin" ? &dist : nullptr);
    else write_vectors(path, ext == "fvecs" || ext == "fbin" ? fm : im);
    const std::vector<char> body = file_bytes(path);
    // loader: 0 as float, 1 ids, 2 ground truth, 3..5 typed; max_rows: all (0xFF: and no view), 1 row
    const bool ids_file = ext == "ivecs" || ext == "ibin";
    const uint8_t typed = ext == "fvecs" || ext == "fbin" ? 3 : ext == "bvecs" || ext == "u8bin" ? 4 : 5;
    seed("dataset", ext + "-all", {static_cast<char>(fmt), static_cast<char>(ids_file ? 2 : 0), 4}, body);
    seed("dataset", ext + "-row1-copy", {static_cast<char>(fmt), static_cast<char>(typed), char(0x80)}, body);
    if (ids_file) seed("dataset", ext + "-ids-2rows", {static_cast<char>(fmt), 1, 1}, body);
  }
}

// ------------------------------------------------------------------------------ workload
void workload_seeds() {
  const char* dists[] = {"uniform", "zipf:1.25", "hot-clusters:0.5"};
  for (int k = 0; k < 3; ++k) {
    Workload w;
    w.distribution = dists[k];
    w.seed = 7;
    w.warmup_count = k;  // 0, 1, 2
    w.measured_count = 3;
    w.pool_size = 10;
    w.clusters = k == 2 ? 2 : 0;
    const size_t total = w.total(), d = 4, gk = 3;
    for (size_t i = 0; i < total; ++i) w.pool_index.push_back(static_cast<uint32_t>((i * 7) % 10));
    w.queries = FloatMatrix(total, d, values(total * d, 3 + k));
    std::vector<int32_t> gt(total * gk);
    for (size_t i = 0; i < gt.size(); ++i) gt[i] = static_cast<int32_t>(i % 10);
    w.groundtruth = IdMatrix(total, gk, gt);
    const std::string path = (scratch / "seed.workload").string();
    write_workload(path, w);
    seed("workload", std::string("workload-") + std::to_string(k), {char(k & 1)}, file_bytes(path));
  }
}

// ------------------------------------------------------------------------------ text
void text_seeds() {
  const char* texts[] = {"64GiB",          "512 MiB",         "4k",       "1048576", "l2",        "IP",
                         "rdma-100g",      "cxl",             "2,12.5",   "none",    "127.0.0.1:7000",
                         "localhost:0",    "insert:0.2",      "zipf:1.5", "uniform", "hot-clusters:0.8",
                         "shine",          "dhnsw",           "tcp",      "verbs",   "adaptive",
                         "best-fit",       "demand",          "even",     "h1:1,h2:2,,h3:3"};
  int i = 0;
  for (const char* t : texts) {
    const std::string s(t);
    seed("text", "text-" + std::to_string(i++), {0}, std::vector<char>(s.begin(), s.end()));
  }
  const std::string token = "s3cret-token \r\nsecond line";
  seed("text", "token-file", {1}, std::vector<char>(token.begin(), token.end()));
}

// ------------------------------------------------------------------------------ image
void image_seeds() {
  const uint64_t size = kMinRegionBytes;
  std::vector<char> region(size, 0);
  auto write = [&](const std::string& name, const RegionHeader& h, uint64_t used) {
    std::memcpy(region.data(), &h, sizeof h);
    const std::string path = (scratch / "seed.img").string();
    memory::write_image(path, region.data(), size, used, h.memnode_id);
    std::vector<char> b = file_bytes(path);
    // created_unix_ns is the clock: zero it and redo the header checksum, for stable seeds
    memory::ImageHeader ih;
    std::memcpy(&ih, b.data(), sizeof ih);
    ih.created_unix_ns = 0;
    ih.header_checksum = checksum64(&ih, offsetof(memory::ImageHeader, header_checksum));
    std::memcpy(b.data(), &ih, sizeof ih);
    seed("image", name, {0}, b);
    seed("image", name + "-fix", {3}, b);
  };
  RegionHeader h = make_region_header(2, size);
  // A region image holds [0, region_used_bytes): keep the seeds small with a data area that
  // starts right after the header page.
  h.scratch_size = 0;
  h.data_offset = kHeaderPageBytes;
  write("none", h, memory::region_used_bytes(h));
  RegionHeader s = h;
  s.mode = static_cast<uint8_t>(Mode::Shine);
  s.dim = 4;
  s.memnode_count = 1;
  s.mode_words[shine_word::kBump] = kHeaderPageBytes + 256;
  s.mode_words[shine_word::kM] = 4;
  s.mode_words[shine_word::kEfConstruction] = 40;
  s.mode_words[shine_word::kFormat] = shine_word::kFormatted;
  for (size_t i = 0; i < 256; ++i) region[kHeaderPageBytes + i] = static_cast<char>(i);
  write("shine", s, memory::region_used_bytes(s));
  RegionHeader d = h;
  d.mode = static_cast<uint8_t>(Mode::Dhnsw);
  d.mode_words[dhnsw_word::kMetadataOffset] = dhnsw::kMetadataOffset;
  d.mode_words[dhnsw_word::kMetadataSize] = 128;
  d.mode_words[dhnsw_word::kDataEnd] = kHeaderPageBytes + 512;
  write("dhnsw", d, memory::region_used_bytes(d));
}

// ------------------------------------------------------------------------------ d-HNSW
struct Sub {
  std::unique_ptr<faiss::IndexHNSWFlat> index;
  std::vector<int64_t> labels;
};

Sub make_sub(size_t n, uint32_t dim, int m, uint64_t seed, faiss::MetricType metric = faiss::METRIC_L2) {
  Sub s;
  s.index = std::make_unique<faiss::IndexHNSWFlat>(static_cast<int>(dim), m, metric);
  s.index->hnsw.efConstruction = 20;
  const std::vector<float> x = values(n * dim, seed);
  s.index->add(static_cast<faiss::Index::idx_t>(n), x.data());
  for (size_t i = 0; i < n; ++i) s.labels.push_back(static_cast<int64_t>(100 + 2 * i));
  return s;
}

dhnsw::MetaHeader meta_header(uint32_t dim, uint32_t m, uint8_t metric) {
  dhnsw::MetaHeader h{};
  h.metadata_offset = dhnsw::kMetadataOffset;
  h.dim = dim;
  h.metric = metric;
  h.num_memnodes = 1;
  h.m = m;
  h.ef_construction = 20;
  h.meta_m = 4;
  return h;
}

void dhnsw_seeds() {
  using namespace dhnsw;
  const uint32_t dim = 4;
  const int m = 4;
  // Two subs in one group and a third alone, on 2 memnodes; a tiny meta-HNSW.
  Sub a = make_sub(12, dim, m, 11), b = make_sub(9, dim, m, 12), c = make_sub(5, dim, m, 13);
  Sub meta = make_sub(3, dim, 4, 14);
  const std::vector<char> mi = serialize_meta(*meta.index);
  {
    std::vector<SubShape> shapes{shape_of(*a.index), shape_of(*b.index), shape_of(*c.index)};
    for (uint32_t memnodes : {1u, 2u}) {
      RegionPlan plan = plan_region(shapes, memnodes, mi.size(), LayoutParams{});
      const Sub* srcs[] = {&a, &b, &c};
      for (size_t i = 0; i < plan.subs.size(); ++i) {
        plan.subs[i].entry_point = srcs[i]->index->hnsw.entry_point;
        plan.subs[i].max_level = srcs[i]->index->hnsw.max_level;
      }
      MetaHeader h = meta_header(dim, m, 0);
      h.num_memnodes = memnodes;
      h.num_vectors = 26;
      const std::vector<char> block = encode_metadata(h, plan.subs, mi.data(), mi.size());
      std::vector<char> prefix{0, 0};
      put(prefix, plan.region_bytes[0]);
      seed("dhnsw_metadata", "block-" + std::to_string(memnodes) + "mn", prefix, block);
      prefix[0] = 3;
      prefix[1] = char(0xFF);
      seed("dhnsw_metadata", "block-" + std::to_string(memnodes) + "mn-fix", prefix, block);
    }
  }
  // Sub-HNSWs: serialized blocks as fetched (slot 0, and slot 1 with an overflow record).
  for (uint8_t metric : {0, 1}) {
    Sub s = make_sub(10, dim, m, 20 + metric, metric ? faiss::METRIC_INNER_PRODUCT : faiss::METRIC_L2);
    const SubShape shape = shape_of(*s.index);
    std::vector<SubShape> shapes{shape, shape};
    RegionPlan plan = plan_region(shapes, 1, 0, LayoutParams{});
    MetaHeader h = meta_header(dim, m, metric);
    for (uint8_t slot : {0, 1}) {
      SubDesc d = plan.subs[slot];
      d.entry_point = s.index->hnsw.entry_point;
      d.max_level = s.index->hnsw.max_level;
      std::vector<char> block(d.block_bytes);
      serialize_sub(*s.index, s.labels.data(), d, block.data());
      std::vector<char> fetched = block;
      if (slot == 1) {
        // The last label moves into an overflow record in front of the block (slot 1 grows backward).
        OverflowRecord r{kLabels, 0, 8};
        std::vector<char> rec(overflow_record_bytes(8), 0);
        std::memcpy(rec.data(), &r, sizeof r);
        std::memcpy(rec.data() + sizeof r, &s.labels.back(), 8);
        d.arrays[kLabels].used -= 8;
        d.overflow_used = rec.size();
        fetched.insert(fetched.begin(), rec.begin(), rec.end());
      }
      std::vector<char> prefix{static_cast<char>(slot == 1 ? 2 : 0)};
      put(prefix, h);
      put(prefix, d);
      seed("dhnsw_sub", "sub-metric" + std::to_string(metric) + "-slot" + std::to_string(slot), prefix, fetched);
    }
  }
  seed("dhnsw_sub", "meta", {1}, mi);
  seed("dhnsw_sub", "meta-ip", {1}, serialize_meta(*make_sub(4, 3, 4, 15, faiss::METRIC_INNER_PRODUCT).index));

  // The control block with an insert buffer right after it (in the harness's memnode 0).
  for (uint32_t d : {4u, 7u}) {
    const uint64_t buffer_offset = align_up(kControlOffset + sizeof(Control), 64);
    const uint64_t buffer_bytes = 16 * 2 * buffer_entry_bytes(d);
    Control ctl = make_control(1, 8192, 65536, buffer_offset, buffer_bytes, d);
    ctl.phase = kBuilding;
    ctl.generation = 5;
    std::vector<char> area(buffer_offset + buffer_bytes - kControlOffset, 0);
    const std::vector<float> x = values(3 * d, 30 + d);
    for (uint32_t i = 0; i < 3; ++i) {
      const uint32_t bucket = lsh_bucket(x.data() + i * d, d, ctl.lsh_bits, ctl.lsh_seed) % ctl.buckets;
      const uint64_t slot = bucket_count(ctl.bucket_words[bucket]);
      if (slot >= ctl.bucket_capacity) continue;
      ctl.bucket_words[bucket] = bucket_word(kBucketActive, slot + 1);
      BufferEntryHeader eh{ctl.generation, 1000 + i};
      const uint64_t at = buffer_entry_offset(ctl, bucket, slot) - kControlOffset;
      std::memcpy(area.data() + at, &eh, sizeof eh);
      std::memcpy(area.data() + at + sizeof eh, x.data() + i * d, 4 * d);
    }
    std::memcpy(area.data(), &ctl, sizeof ctl);
    seed("dhnsw_control", "control-dim" + std::to_string(d), {static_cast<char>(d - 1), 0, 1}, area);
    seed("dhnsw_control", "control-dim" + std::to_string(d) + "-ip", {static_cast<char>(d - 1), 1, 2}, area);
  }
  seed("dhnsw_control", "no-buffer", {3, 0, 0}, bytes_of(make_control(1, 8192, 65536, 0, 0, 4)));
}

// ------------------------------------------------------------------------------ control frames
std::vector<char> frame(uint16_t type, const std::vector<char>& payload, uint16_t version = fabric::kControlVersion) {
  fabric::ControlFrame f{fabric::kControlMagic, version, type, static_cast<uint32_t>(payload.size()), 0};
  std::vector<char> out = bytes_of(f);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void control_seeds() {
  using namespace fabric::ctl;
  const std::vector<char> addr(32, 'a'), nonce(kNonceBytes, 'n');
  // Server side: a hello, then pings and a register.
  Writer hello;
  hello.put(static_cast<uint8_t>(fabric::Mode::Shine));
  hello.put(static_cast<uint8_t>(fabric::Provider::Shm));
  hello.put(uint32_t{3});
  hello.put(uint8_t{1});
  const std::vector<char> proof = hello_proof("token", nonce, 3, addr);
  hello.bytes(proof.data(), proof.size());
  hello.bytes(addr.data(), addr.size());
  Writer reg;
  reg.bytes(addr.data(), 20);
  std::vector<char> server = frame(kHello, hello.b);
  for (const auto& f : {frame(kPing, {}), frame(kRegister, reg.b), frame(kPing, {})}) server.insert(server.end(), f.begin(), f.end());
  seed("control", "server-hello-ping-register", {1}, server);
  seed("control", "server-hello-bytewise", {char(0x01)}, frame(kHello, hello.b));
  seed("control", "server-hello-v2", {char(0x7F)}, frame(kHello, hello.b, 2));
  // Client side: challenge, then a welcome (with a region header) and pongs; or a refusal.
  Writer welcome;
  welcome.put(uint16_t{1});
  welcome.put(static_cast<uint8_t>(fabric::Mode::Dhnsw));
  welcome.put(uint64_t{0x7f0000000000});
  welcome.put(uint64_t{kMinRegionBytes});
  welcome.put(uint64_t{0x1234});
  welcome.bytes(addr.data(), addr.size());
  welcome.put(uint16_t{2});
  welcome.bytes(addr.data(), 16);
  welcome.bytes(addr.data(), 24);
  const RegionHeader rh = make_region_header(1, kMinRegionBytes);
  welcome.b.insert(welcome.b.end(), reinterpret_cast<const char*>(&rh), reinterpret_cast<const char*>(&rh) + sizeof rh);
  std::vector<char> client = frame(kChallenge, nonce);
  for (const auto& f : {frame(kWelcome, welcome.b), frame(kPong, {}), frame(kRegistered, {})})
    client.insert(client.end(), f.begin(), f.end());
  seed("control", "client-challenge-welcome", {char(0x40)}, client);
  Writer refuse;
  const std::string why = "wrong cluster token";
  refuse.bytes(why.data(), why.size());
  seed("control", "client-refuse", {0}, frame(kRefuse, refuse.b));
}

// ------------------------------------------------------------------------------ messages
void message_seeds() {
  std::vector<char> seq;
  // [sender][time step][u16 length][payload]: cn 0 and cn 1 join a run of 2, forward,
  // barrier, heartbeat, a stats request, a store request, a leave.
  auto msg = [&](uint8_t sender, uint8_t step, const std::vector<char>& payload) {
    seq.push_back(static_cast<char>(sender));
    seq.push_back(static_cast<char>(step));
    put(seq, static_cast<uint16_t>(payload.size()));
    seq.insert(seq.end(), payload.begin(), payload.end());
  };
  using relay::Type;
  const std::string body = "query 17";
  msg(0, 1, relay::encode(Type::Join, 0, 0, 2, 1));
  msg(1, 1, relay::encode(Type::Join, 1, 1, 2, 1));
  msg(0, 10, relay::encode(Type::Forward, 0, 1, 2, 5, body.data(), body.size()));
  msg(1, 10, relay::encode(Type::Forward, 1, relay::kAll, 2, 6, body.data(), body.size()));
  msg(0, 10, relay::encode(Type::Forward, 0, 5, 2, 7, body.data(), body.size()));
  msg(0, 50, relay::encode(Type::Barrier, 0, 0, 2, 0));
  msg(0x81, 50, relay::encode(Type::Heartbeat, 1, 1, 2, 0));
  msg(1, 50, relay::encode(Type::Barrier, 1, 1, 2, 0));
  msg(2, 1, bytes_of(admin::StatsRequest{static_cast<uint32_t>(admin::MsgType::StatsRequest), 0, 9}));
  msg(2, 1, bytes_of(admin::make_store_request("/tmp/nowhere", 10)));
  msg(0x80, 255, relay::encode(Type::Heartbeat, 0, 0, 2, 0));
  msg(0x80, 255, relay::encode(Type::Heartbeat, 0, 0, 2, 0));
  msg(0x81, 255, relay::encode(Type::Barrier, 1, 1, 2, 1));
  msg(0, 1, relay::encode(Type::Leave, 0, 0, 2, 0));
  const std::string text = "hello, not a relay message";
  msg(3, 1, std::vector<char>(text.begin(), text.end()));
  seed("messages", "relay-run", {}, seq);
  seq.clear();
  msg(4, 0, bytes_of(admin::make_store_request("images", 1)));
  std::vector<char> short_store = bytes_of(admin::make_store_request("x", 2));
  short_store.resize(24);
  msg(4, 0, short_store);
  seed("messages", "admin", {}, seq);
}

// ------------------------------------------------------------------------------ trace
void trace_seeds() {
  std::vector<std::vector<char>> files;
  for (uint32_t cn = 0; cn < 2; ++cn) {
    cache::TraceMeta meta;
    meta.cn_id = cn;
    meta.num_cns = 2;
    meta.dim = 4;
    meta.capacity_bytes = 4096;
    meta.admit_probability = 0.5;
    meta.start_unix_ns = 1'700'000'000'000'000'000;
    std::memcpy(meta.label, "adaptive", 8);
    const std::string path = (scratch / ("cn" + std::to_string(cn) + ".trace")).string();
    {
      cache::TraceWriter w(path, meta);
      for (uint32_t i = 0; i < 12; ++i)
        w.record(RemotePtr(static_cast<uint16_t>(i % 2), 4096 + 64 * ((i * 5 + cn) % 7)), i % 3, i % 4 == 0, i >= 4);
      w.close();
    }
    std::vector<char> b = file_bytes(path);
    // t_us: small, increasing (the writer stamps the clock)
    for (uint32_t i = 0; i < 12; ++i) {
      const uint32_t t = 10 * i + cn;
      std::memcpy(b.data() + sizeof(cache::TraceFileHeader) + i * sizeof(cache::TraceRecord) + 8, &t, 4);
    }
    files.push_back(b);
  }
  std::vector<char> prefix;
  put(prefix, static_cast<uint16_t>(files[0].size()));
  std::vector<char> one = prefix;
  one.insert(one.end(), files[0].begin(), files[0].end());
  seed("trace", "two-cns", one, files[1]);
  seed("trace", "one-cn", one, {});
}

// ------------------------------------------------------------------------------ hnswlib
void hnswlib_seeds() {
  for (uint32_t dim : {3u, 8u}) {
    hnswlib::L2Space space(dim);
    hnswlib::HierarchicalNSW<float> index(&space, 16, 4, 20, 100 + dim);
    const std::vector<float> x = values(12 * dim, 40 + dim);
    for (size_t i = 0; i < 12; ++i) index.addPoint(x.data() + i * dim, 500 + i);
    const std::string path = (scratch / "seed.hnsw").string();
    index.saveIndex(path);
    const std::vector<char> b = file_bytes(path);
    seed("hnswlib", "index-dim" + std::to_string(dim), {static_cast<char>(dim)}, b);
    seed("hnswlib", "index-dim" + std::to_string(dim) + "-any", {0}, b);
  }
  hnswlib::L2Space space(2);
  hnswlib::HierarchicalNSW<float> empty(&space, 4, 2, 10, 1);
  const std::string path = (scratch / "empty.hnsw").string();
  empty.saveIndex(path);
  seed("hnswlib", "empty", {0}, file_bytes(path));
}

// ------------------------------------------------------------------------------ shine
void shine_seeds() {
  const uint64_t size = kMinRegionBytes;
  for (uint32_t dim : {4u, 5u}) {
    auto c = fabric::LocalCluster::create(1, size);
    RegionHeader h = make_region_header(0, size);
    h.scratch_size = 0;  // the data area right after the header page: small seeds
    h.data_offset = kHeaderPageBytes;
    std::memcpy(c->region(0), &h, sizeof h);
    c->refresh_headers();
    auto ep = c->make_endpoint(8u << 20);
    shine::GraphParams p;
    p.dim = dim;
    p.m = 4;
    p.ef_construction = 16;
    p.metric = dim == 4 ? Metric::L2 : Metric::IP;
    const shine::GraphParams got = shine::format_or_attach(*c, *ep, &p);
    c->refresh_headers();
    shine::Graph g(*c, got);
    compute::Scheduler s(*ep);
    shine::Worker w(g, s, 3);
    shine::OpContext ctx;
    const std::vector<float> x = values(12 * dim, 50 + dim);
    for (uint32_t i = 0; i < 12; ++i) compute::run_sync(s, w.insert(x.data() + i * dim, 700 + i, ctx));
    RegionHeader after;
    std::memcpy(&after, c->region(0), sizeof after);
    const char* r = c->region(0);
    std::vector<char> body(r, r + sizeof after);
    body.insert(body.end(), r + kHeaderPageBytes, r + after.mode_words[shine_word::kBump]);
    seed("shine", "graph-dim" + std::to_string(dim), {5, 16, 1}, body);
    seed("shine", "graph-dim" + std::to_string(dim) + "-k1-ef1", {0, 0, 9}, body);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds CORPUS_DIR   (e.g. tests/fuzz/corpus)\n";
    return 2;
  }
  out_root = argv[1];
  scratch = fs::temp_directory_path() / ("dmhnsw-seeds-" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  try {
    dataset_seeds();
    workload_seeds();
    text_seeds();
    image_seeds();
    dhnsw_seeds();
    control_seeds();
    message_seeds();
    trace_seeds();
    hnswlib_seeds();
    shine_seeds();
  } catch (const std::exception& e) {
    std::cerr << "fuzz_make_seeds: " << e.what() << "\n";
    fs::remove_all(scratch);
    return 1;
  }
  fs::remove_all(scratch);
  std::cout << "seeds written under " << out_root.string() << "\n";
  return 0;
}
