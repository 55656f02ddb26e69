// Two-sided fabric messages a memnode serves (memnode_main.cpp's handler): the SHINE query
// relay (memory/relay.hpp: relay::decode and Relay's members, forwarding, barriers, liveness)
// and the admin requests (memory/admin_service.hpp handle_admin: store, stats; run with no
// --store-dir, so a store is refused before it writes anything), in that order, with the
// relay's check that a computenode speaks only as the id its transport authenticated.
// Input: a sequence of messages, each [sender byte][time step byte][u16 length][payload]; the
// sender's low 3 bits are its computenode id (endpoint handle id + 1), bit 3 a second endpoint
// of it, bit 7 a tick of the relay's clock after the message. Everything the relay sends must
// be a relay message to an endpoint that spoke; every admin reply must be the size of its type.
#include <chrono>
#include <cstdint>
#include <exception>
#include <set>
#include <vector>

#include "memory/admin.hpp"
#include "memory/admin_service.hpp"
#include "memory/relay.hpp"
#include "memory/relay_protocol.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::vector<char> region(4096);
  fuzz::Input in(data, size);
  std::set<uint64_t> spoke;
  memory::Relay relay(
      3, 1,
      [&](uint64_t to, const std::vector<char>& bytes) {
        DMHNSW_FUZZ_CHECK(spoke.count(to) == 1);
        const auto h = relay::decode(bytes);
        DMHNSW_FUZZ_CHECK(h.has_value() && h->memnode == 3 && h->copy == 1 && bytes.size() <= fabric::kMaxMessage);
      },
      std::chrono::milliseconds(1000));
  auto now = memory::Relay::Clock::time_point{} + std::chrono::hours(1);
  while (in.left() > 0) {
    const uint8_t sender = in.byte();
    const uint8_t step = in.byte();
    const std::vector<char> payload = in.chunk();
    const uint32_t cn = sender & 7u;
    const uint64_t handle = 1 + (sender & 15u);
    now += std::chrono::milliseconds(4 * step);
    try {
      if (auto rh = relay::decode(payload); rh && rh->from_cn != cn) continue;  // dropped, as the memnode does
      spoke.insert(handle);
      if (!relay.on_message(payload, handle, now)) {
        if (auto out = memory::handle_admin(payload, region.data(), region.size(), 3, 0, "")) {
          const auto t = admin::message_type(out->data(), out->size());
          DMHNSW_FUZZ_CHECK(t.has_value());
          if (*t == admin::MsgType::StoreReply) {
            admin::StoreReply rep;
            DMHNSW_FUZZ_CHECK(admin::decode(*out, admin::MsgType::StoreReply, rep) && rep.ok == 0);
            (void)admin::get_text(rep.message, sizeof rep.message, rep.message_len);
          } else {
            admin::StatsReply rep;
            DMHNSW_FUZZ_CHECK(admin::decode(*out, admin::MsgType::StatsReply, rep));
          }
        }
      }
      if (sender & 0x80) relay.tick(now);
    } catch (const std::exception& e) {
      fuzz::refused(e);
    }
  }
  for (uint32_t cn = 0; cn < relay::kMaxCns; ++cn) (void)relay.alive(cn);
  return 0;
}
