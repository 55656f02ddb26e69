#pragma once
// Deletes, inserts into deleted elements and upserts on an hnswlib 0.6.2 index, for
// hnswlib-bench --step (the churn reference of experiments/churn). Included by hnswlib_bench.cpp
// only, after <hnswlib/hnswlib.h> (one translation unit per binary may include that).
//
// hnswlib 0.7 added replace_deleted: an insert of a new label takes a deleted element, relabels
// it, clears its mark and gives it the new vector with updatePoint (its neighbours' lists are
// rebuilt from their two-hop neighbourhoods, then the element is linked as an insert would).
// Debian 12 ships 0.6.2, which has markDelete, unmarkDeletedInternal, updatePoint and the label
// table as public members but not the reuse: ChurnIndex does that step with those members, in
// the order 0.7 does it, so the comparison is with hnswlib's algorithm rather than with a
// growing index.
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/dataset.hpp"
#include "tools/hnswlib_space.hpp"

namespace dmhnsw::hnswlib_churn {

/// One --step: delete:IDS, insert:DATA:IDS, upsert:DATA:IDS or query.
struct Step {
  std::string op, data, ids;
};

inline Step parse_step(const std::string& text) {
  Step s;
  const auto first = text.find(':');
  s.op = text.substr(0, first);
  const std::string rest = first == std::string::npos ? "" : text.substr(first + 1);
  if (s.op == "query" && first == std::string::npos) return s;
  if (s.op == "delete" && !rest.empty() && rest.find(':') == std::string::npos) {
    s.ids = rest;
    return s;
  }
  if ((s.op == "insert" || s.op == "upsert") && rest.find(':') != std::string::npos) {
    s.data = rest.substr(0, rest.find(':'));
    s.ids = rest.substr(rest.find(':') + 1);
    if (!s.data.empty() && !s.ids.empty() && s.ids.find(':') == std::string::npos) return s;
  }
  throw std::invalid_argument("--step " + text +
                              ": expected delete:IDS, insert:DATA:IDS, upsert:DATA:IDS or query");
}

struct StepResult {
  std::string op;
  std::size_t count = 0;     // ids in the step
  std::size_t done = 0;      // deleted, inserted or replaced
  std::size_t missing = 0;   // delete/upsert: id not live; insert: id already live (refused)
  std::size_t reused = 0;    // insert: deleted elements taken
  std::size_t appended = 0;  // insert (and upsert of an absent id): new elements
  double seconds = 0;
  std::size_t elements = 0;  // the index's elements afterwards (live + deleted)
};

/// Bytes the index's elements take: level-0 blocks (vector, list, label) and upper lists.
inline std::size_t element_bytes(const hnswlib::HierarchicalNSW<float>& index) {
  std::size_t bytes = index.cur_element_count * index.size_data_per_element_;
  for (std::size_t i = 0; i < index.cur_element_count; ++i)
    bytes += static_cast<std::size_t>(index.element_levels_[i]) * index.size_links_per_element_;
  return bytes;
}

class ChurnIndex {
 public:
  using Index = hnswlib::HierarchicalNSW<float>;
  ChurnIndex(Index& index, bool replace_deleted) : index_(index), replace_deleted_(replace_deleted) {}

  /// Whether `label` is in the index and not deleted.
  bool live(std::uint64_t label) const {
    const auto it = index_.label_lookup_.find(label);
    return it != index_.label_lookup_.end() && !index_.isMarkedDeleted(it->second);
  }

  /// markDelete per id (hnswlib's own call; its deleted count is not atomic in 0.6.2, so one
  /// thread, as the Python binding's mark_deleted loop runs). Deleted elements become free.
  void remove(const std::vector<std::uint64_t>& ids, StepResult& r) {
    for (std::uint64_t id : ids) {
      if (!live(id)) {
        ++r.missing;
        continue;
      }
      const hnswlib::tableint internal = index_.label_lookup_.at(id);
      index_.markDelete(id);
      free_.push_back(internal);
      ++r.done;
    }
  }

  /// addPoint of a new label, into a deleted element when there is one and replace_deleted is
  /// on (0.7's addPoint(..., replace_deleted = true)); a live label is refused (counted).
  void insert(const float* v, std::uint64_t label, StepResult& r) {
    hnswlib::tableint slot = 0;
    bool reuse = false;
    {
      std::lock_guard<std::mutex> lock(free_mutex_);
      {
        std::lock_guard<std::mutex> table(index_.cur_element_count_guard_);
        if (index_.label_lookup_.count(label)) {
          std::lock_guard<std::mutex> c(counts_);
          ++r.missing;
          return;
        }
        if (replace_deleted_ && !free_.empty()) {
          slot = free_.back();
          free_.pop_back();
          reuse = true;
          index_.label_lookup_.erase(index_.getExternalLabel(slot));
          index_.label_lookup_[label] = slot;
          index_.setExternalLabel(slot, label);
        }
      }
      if (reuse) index_.unmarkDeletedInternal(slot);  // its count is guarded by free_mutex_ here
    }
    if (reuse) {
      std::unique_lock<std::mutex> update(
          index_.link_list_update_locks_[slot & (Index::max_update_element_locks - 1)]);
      index_.updatePoint(v, slot, 1.0f);
    } else {
      index_.addPoint(v, label);
    }
    std::lock_guard<std::mutex> c(counts_);
    ++r.done;
    ++(reuse ? r.reused : r.appended);
  }

  /// addPoint of a live label: hnswlib replaces its vector in place (updatePoint).
  void upsert(const float* v, std::uint64_t label, StepResult& r) {
    const bool was_live = [&] {
      std::lock_guard<std::mutex> table(index_.cur_element_count_guard_);
      return live(label);
    }();
    if (!was_live) {
      std::lock_guard<std::mutex> c(counts_);
      ++r.missing;
      return;
    }
    index_.addPoint(v, label);
    std::lock_guard<std::mutex> c(counts_);
    ++r.done;
  }

 private:
  Index& index_;
  bool replace_deleted_;
  std::mutex free_mutex_;
  std::mutex counts_;  // the StepResult's counters, from the inserting threads
  std::vector<hnswlib::tableint> free_;
};

}  // namespace dmhnsw::hnswlib_churn
