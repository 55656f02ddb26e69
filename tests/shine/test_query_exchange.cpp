// The shine query's exchange (compute/shine/query_exchange.hpp): routed queries numbered per
// sender and receiver, repeats dropped, and the sync that recovers what a dead relay held.
#include <catch2/catch.hpp>

#include "compute/shine/query_exchange.hpp"

using namespace dmhnsw::shine::query_detail;

TEST_CASE("query exchange: a receiver names what it lacks, the sender sends exactly that, repeats are dropped") {
  Exchange sender(2), receiver(2);
  // Computenode 0 routes 10 queries to computenode 1; 3, 4 and 9 are lost with a relay.
  for (uint32_t pos = 100; pos < 110; ++pos) CHECK(sender.log_sent(0, 1, pos) == pos - 100);
  sender.note_done_sent(0, 1, 10);
  for (uint32_t seq = 0; seq < 10; ++seq)
    if (seq != 3 && seq != 4 && seq != 9) CHECK(receiver.on_query(0, 0, seq, Item{100 + seq, true, {}}));
  CHECK_FALSE(receiver.on_query(0, 0, 5, Item{105, true, {}}));  // a repeat
  // No done count yet: computenode 0 owes it, and everything from seq 9 on.
  auto owed = receiver.owed(0, 1);
  REQUIRE(owed.size() == 1);
  CHECK(owed[0].from == 0);
  CHECK(owed[0].next == 9);
  CHECK(owed[0].missing == std::vector<uint32_t>{3, 4});
  const auto again = sender.to_resend(0, 1, owed[0].next, owed[0].missing);
  CHECK(again == std::vector<std::pair<uint32_t, uint32_t>>{{3, 103}, {4, 104}, {9, 109}});
  REQUIRE(sender.done_sent(0, 1) == std::optional<uint64_t>(10));
  CHECK_FALSE(sender.done_sent(0, 0).has_value());
  receiver.on_done(0, 0, 10);
  CHECK_FALSE(receiver.finished(0, 1, true, true));  // 7 of 10 queued, 3 missing
  for (const auto& [seq, pos] : again) CHECK(receiver.on_query(0, 0, seq, Item{pos, true, {}}));
  for (const auto& [seq, pos] : again) CHECK_FALSE(receiver.on_query(0, 0, seq, Item{pos, true, {}}));
  CHECK(receiver.received(0) == 10);
  CHECK(receiver.owed(0, 1).empty());
  Item it;
  uint32_t n = 0;
  while (receiver.pop(0, it)) {
    receiver.served(0);
    ++n;
  }
  CHECK(n == 10);  // each query answered once
  CHECK(receiver.finished(0, 1, true, true));
}

TEST_CASE("query exchange: a gone peer owes nothing, and a sync names at most kSyncMissingMax seqs") {
  Exchange receiver(3);
  receiver.on_query(0, 0, kSyncMissingMax + 10, Item{1, true, {}});
  receiver.set_gone(2);
  auto owed = receiver.owed(0, 1);
  REQUIRE(owed.size() == 1);  // computenode 2 is gone
  CHECK(owed[0].next == kSyncMissingMax + 11);
  CHECK(owed[0].missing.size() == kSyncMissingMax);
}
