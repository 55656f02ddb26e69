#include "common/id_table.hpp"

#include <xxhash.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace dmhnsw {

IdTable IdTable::sized_for(uint64_t ids, uint16_t memnodes, uint64_t offset) {
  if (memnodes == 0) throw std::invalid_argument("id index: no memnodes");
  IdTable t;
  t.memnodes = memnodes;
  t.offset = offset;
  // Two slots per id: with two choices of 7-slot buckets at half load both are full very
  // rarely (each needs 7 entries where 3.5 are expected, and inserts fill the emptier one).
  constexpr uint64_t slots = IdSlot::kPerBucket - 1;
  t.buckets = std::max<uint64_t>(2, (2 * ids + slots - 1) / slots);
  return t;
}

uint64_t copy_key(uint64_t id, unsigned k) {
  if (k == 0) return id;
  const uint64_t in[2] = {id, k};
  return XXH3_64bits(in, sizeof in) | (uint64_t{1} << 63);
}

IdHash hash_id(uint64_t id, const IdTable& t) {
  const XXH128_hash_t h = XXH3_128bits(&id, sizeof id);
  IdHash r;
  r.bucket[0] = h.low64 % t.buckets;
  r.bucket[1] = h.high64 % t.buckets;
  if (r.bucket[1] == r.bucket[0]) r.bucket[1] = (r.bucket[0] + 1) % t.buckets;
  r.fingerprint = static_cast<uint32_t>(h.low64 >> 52);
  return r;
}

IdHash hash_key(const IdKey& k, const IdTable& t) {
  IdHash h = hash_id(k.key, t);
  if (k.copy != 0) h.fingerprint = (hash_id(k.label, t).fingerprint ^ k.copy) & 0xfff;
  return h;
}

std::vector<std::vector<uint64_t>> fill_id_table(const IdTable& t, std::span<const std::pair<IdKey, RemotePtr>> entries,
                                                 const std::string& what) {
  std::vector<std::vector<uint64_t>> words(t.memnodes, std::vector<uint64_t>(t.bytes_per_memnode() / 8, 0));
  auto word = [&](uint64_t bucket, unsigned pos) -> uint64_t& {
    return words[bucket % t.memnodes][(bucket / t.memnodes) * IdSlot::kPerBucket + pos];
  };
  auto used = [&](uint64_t bucket) {
    unsigned u = 0;
    for (unsigned s = 1; s < IdSlot::kPerBucket; ++s) u += word(bucket, s) != 0;
    return u;
  };
  std::unordered_map<uint64_t, size_t> seen;
  seen.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [key, at] = entries[i];
    const uint64_t id = key.label;
    if (auto [it, fresh] = seen.emplace(key.key, i); !fresh)
      throw std::invalid_argument(what + ": entries " + std::to_string(it->second) + " and " + std::to_string(i) +
                                  " both have id " + std::to_string(id) + ": an id index maps each id to one place");
    if (!IdSlot::fits(at))
      throw std::invalid_argument(what + ": memnode " + std::to_string(at.node()) + " offset " +
                                  std::to_string(at.offset()) + " (id " + std::to_string(id) +
                                  ") lies beyond what an id slot can name");
    const IdHash h = hash_key(key, t);
    const uint64_t b = used(h.bucket[1]) < used(h.bucket[0]) ? h.bucket[1] : h.bucket[0];
    unsigned s = 1;
    while (s < IdSlot::kPerBucket && word(b, s) != 0) ++s;
    if (s == IdSlot::kPerBucket)
      throw std::invalid_argument(what + ": the id index of " + std::to_string(t.buckets) +
                                  " buckets has both buckets of id " + std::to_string(id) + " full (a larger table?)");
    word(b, s) = IdSlot::make(h.fingerprint, at);
  }
  return words;
}

}  // namespace dmhnsw
