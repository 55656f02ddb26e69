#include "compute/shine/sample.hpp"

#include <spdlog/spdlog.h>

#include <cstring>
#include <functional>

namespace dmhnsw::shine {



namespace {

/// The first node record of a memnode (after the id index and its companions, when there is one).
uint64_t records_start(const Graph& g, const RegionHeader& h) {
  return g.params().records != 0 ? g.params().records : (h.data_offset + 63) / 64 * 64;
}

/// Calls visit(ptr, level, record bytes) for every node of every memnode, in order.
void scan(const Graph& g, fabric::Endpoint& ep, const std::function<void(RemotePtr, unsigned, const char*)>& visit) {
  const auto& L = g.layout();
  const uint64_t chunk = 4u << 20;
  fabric::Buffer buf = ep.alloc(chunk);
  for (uint16_t n = 0; n < g.num_memnodes(); ++n) {
    RegionHeader h;
    ep.read(RemotePtr(n, 0), &h, sizeof h);
    const uint64_t start = records_start(g, h), end = h.mode_words[shine_word::kBump];
    uint64_t at = start;
    while (at < end) {
      uint64_t len = std::min(chunk, end - at);
      ep.read(RemotePtr(n, at), buf.data(), len);
      uint64_t off = 0;
      bool stop = false;
      while (off + sizeof(NodeFront) <= len) {
        NodeFront f;
        std::memcpy(&f, buf.data() + off, sizeof f);
        if (!NodeHeader::valid(f.header)) {  // a node being written right now: stop here
          spdlog::warn("partitioning: memnode {} offset {}: not a node (an insert in progress?); scan stops there", n,
                       at + off);
          stop = true;
          break;
        }
        unsigned level = NodeHeader::level(f.header);
        uint64_t bytes = (L.node_bytes(level) + 63) / 64 * 64;
        if (off + L.vector_read_bytes() > len) break;  // the vector continues in the next chunk
        visit(RemotePtr(n, at + off), level, buf.data() + off);
        off += bytes;
      }
      if (stop) break;
      if (off == 0) throw fabric::FabricError("partitioning: memnode " + std::to_string(n) + " offset " +
                                              std::to_string(at) + ": a node larger than the scan chunk");
      at += off;
    }
  }
}

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace

uint64_t index_bytes(const Graph& g, fabric::Endpoint& ep) {
  uint64_t total = 0;
  for (uint16_t n = 0; n < g.num_memnodes(); ++n) {
    RegionHeader h;
    ep.read(RemotePtr(n, 0), &h, sizeof h);
    total += h.mode_words[shine_word::kBump] - records_start(g, h);
  }
  return total;
}

LevelSample sample_level(const Graph& g, fabric::Endpoint& ep, uint64_t min_nodes, uint64_t max_sample, uint64_t seed) {
  LevelSample s;
  s.per_level.assign(kMaxLevel + 1, 0);
  scan(g, ep, [&](RemotePtr, unsigned level, const char*) {
    ++s.per_level[std::min<unsigned>(level, kMaxLevel)];
    ++s.index_nodes;
  });
  s.index_bytes = index_bytes(g, ep);
  // The first level from the top holding >= min_nodes nodes (a node at level l is on all below).
  uint64_t at_or_above = 0;
  s.level = 0;
  for (int l = static_cast<int>(kMaxLevel); l >= 0; --l) {
    at_or_above += s.per_level[static_cast<size_t>(l)];
    if (at_or_above >= min_nodes) {
      s.level = static_cast<unsigned>(l);
      break;
    }
  }
  s.nodes_at_level = 0;
  for (size_t l = s.level; l < s.per_level.size(); ++l) s.nodes_at_level += s.per_level[l];
  // Deterministic down-sampling by a hash of the node's address.
  const double keep = s.nodes_at_level <= max_sample ? 1.0 : static_cast<double>(max_sample) / static_cast<double>(s.nodes_at_level);
  const uint64_t threshold = keep >= 1.0 ? ~uint64_t{0} : static_cast<uint64_t>(keep * 18446744073709551615.0);
  const uint32_t d = g.params().dim;
  scan(g, ep, [&](RemotePtr p, unsigned level, const char* rec) {
    if (level < s.level || mix(p.raw() ^ seed) > threshold) return;
    const float* v = reinterpret_cast<const float*>(rec + NodeLayout::vector_offset());
    s.vectors.insert(s.vectors.end(), v, v + d);
  });
  return s;
}

}  // namespace dmhnsw::shine
