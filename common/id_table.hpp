#pragma once
// The id index's layout (compute/id_index.hpp has the one-sided operations on it): an
// application's 64-bit id -> the remote word that holds the id (a shine node record's label word,
// a d-HNSW sub-HNSW's label entry), a table of two-choice buckets spread over the memnodes.
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/fabric/remote_ptr.hpp"

namespace dmhnsw {

/// One 8-byte slot of the id index (compute/id_index.hpp): 0 when free, else an entry:
/// bits 52..63 a fingerprint (12 bits of the id's hash), bits 40..51 the node's memnode, bits
/// 0..39 its offset / 8 (records are 8-byte aligned: regions up to 8 TiB, 4,096 memnodes).
struct IdSlot {
  static constexpr unsigned kPerBucket = 8;
  static constexpr uint64_t kBucketBytes = 8 * kPerBucket;  // one READ
  static constexpr uint64_t kOffsetLimit = uint64_t{1} << 43;
  static constexpr bool fits(RemotePtr p) { return p.node() < 4096 && p.offset() % 8 == 0 && p.offset() < kOffsetLimit; }
  static constexpr uint64_t make(uint32_t fingerprint, RemotePtr p) {
    return (uint64_t{fingerprint & 0xfff} << 52) | (uint64_t{p.node()} << 40) | (p.offset() >> 3);
  }
  static constexpr uint32_t fingerprint(uint64_t w) { return static_cast<uint32_t>(w >> 52); }
  static constexpr RemotePtr node(uint64_t w) {
    return RemotePtr(static_cast<uint16_t>((w >> 40) & 0xfff), (w & ((uint64_t{1} << 40) - 1)) << 3);
  }
};
static_assert(IdSlot::node(IdSlot::make(0xabc, RemotePtr(4095, 8 * 12345))) == RemotePtr(4095, 8 * 12345));
static_assert(IdSlot::fingerprint(IdSlot::make(0xabc, RemotePtr(1, 4096))) == 0xabc);
static_assert(IdSlot::make(0, RemotePtr(0, 8)) != 0);  // a node is never at offset 0: an entry is never free
static_assert(IdSlot::kBucketBytes == 64);

/// Where the table is: `buckets` buckets of IdSlot::kPerBucket slots, bucket b at `offset` +
/// (b / memnodes) * IdSlot::kBucketBytes on memnode b % memnodes.
struct IdTable {
  uint16_t memnodes = 0;
  uint64_t offset = 0;   // the same on every memnode
  uint64_t buckets = 0;  // in all

  /// Bytes the table takes on each memnode.
  uint64_t bytes_per_memnode() const { return (buckets + memnodes - 1) / memnodes * IdSlot::kBucketBytes; }
  RemotePtr bucket(uint64_t b) const {
    return RemotePtr(static_cast<uint16_t>(b % memnodes), offset + (b / memnodes) * IdSlot::kBucketBytes);
  }
  /// A table for `ids` ids at most, at `offset` on each of `memnodes` memnodes: two slots per id.
  static IdTable sized_for(uint64_t ids, uint16_t memnodes, uint64_t offset);
};

/// The key under which copy `k` of id `id` is mapped (d-HNSW's boundary copies,
/// compute/dhnsw/build.hpp): `id` itself for k = 0, else a hash of both with the top bit set,
/// which no application id has (ids are below 2^63). Its entry names a label word holding `id`.
uint64_t copy_key(uint64_t id, unsigned k);

/// What the id index looks up: the key its buckets are hashed from, and the label the word an
/// entry names must hold. An id is its own key; a boundary copy's key is copy_key().
struct IdKey {
  uint64_t key;
  uint64_t label;
  unsigned copy = 0;  // k of copy_key(label, k)
  IdKey(uint64_t id) : key(id), label(id) {}  // NOLINT(google-explicit-constructor): an id is its own key
  static IdKey copy_of(uint64_t id, unsigned k) {
    IdKey r(id);
    r.key = copy_key(id, k);
    r.copy = k;
    return r;
  }
};

/// The two buckets of an id and the bits its entries carry.
struct IdHash {
  uint64_t bucket[2];
  uint32_t fingerprint;
};
IdHash hash_id(uint64_t id, const IdTable& t);
/// An IdKey's buckets (from its key) and fingerprint: a copy k's is the id's own XOR k, so the
/// keys of one id never share a fingerprint (their entries all name words holding the id, so
/// the label alone cannot tell them apart).
IdHash hash_key(const IdKey& k, const IdTable& t);

/// The table's words on each memnode for `entries` (id, the place its entry names), each put as
/// IdIndex::insert would (the emptier of its two buckets). Throws std::invalid_argument naming
/// `what` for an id twice, a place no slot can name, or a full pair of buckets.
std::vector<std::vector<uint64_t>> fill_id_table(const IdTable& t, std::span<const std::pair<IdKey, RemotePtr>> entries,
                                                 const std::string& what);

}  // namespace dmhnsw
