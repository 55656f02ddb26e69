// Control-protocol frames (common/fabric/control_wire.hpp) as both ends read them from the
// TCP control connection: take_frame's splitting of a byte stream into frames (the memnode's
// never-waiting reader and the computenode's drain), then per frame what bootstrap_server.cpp
// does (hello: decode_hello and its proof; register: decode_register) or what bootstrap.cpp
// does (challenge, refuse text, welcome: decode_welcome and the region header it carries).
// Input: [side byte][stream bytes...], the stream arriving in pieces of 1..256 bytes as
// read_available appends them.
#include <cstdint>
#include <exception>
#include <vector>

#include "common/fabric/control_wire.hpp"
#include "common/region.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;
using namespace dmhnsw::fabric;
using namespace dmhnsw::fabric::ctl;

namespace {

/// One complete frame, as the memnode (server) or the computenode (client) handles it.
void handle(bool server, bool first, const ControlFrame& f, const std::vector<char>& payload) {
  DMHNSW_FUZZ_CHECK(f.magic == kControlMagic && f.length == payload.size() && f.length <= kMaxPayload);
  if (server) {
    if (first) {  // handle_hello: a version or type mismatch is refused before decoding
      if (f.version != kControlVersion || f.type != kHello) return;
      const HelloPayload hp = decode_hello(payload, "fuzz");
      DMHNSW_FUZZ_CHECK(hp.proof.size() + hp.hello.fabric_addr.size() + 15 <= payload.size());
      const std::vector<char> nonce(kNonceBytes, 7);
      (void)hello_proof("", nonce, hp.hello.cn_id, hp.hello.fabric_addr);
    } else if (f.type == kRegister) {  // serve
      const std::vector<char> addr = decode_register(payload, "fuzz");
      DMHNSW_FUZZ_CHECK(!addr.empty() && addr.size() <= 256 && addr.size() + 4 <= payload.size());
    }
    return;
  }
  if (f.type == kRefuse) {
    Reader r{payload, 0, "fuzz"};
    DMHNSW_FUZZ_CHECK(r.str().size() + 4 <= payload.size());
  } else if (f.type == kWelcome) {
    const Welcome w = decode_welcome(payload, "fuzz");
    DMHNSW_FUZZ_CHECK(w.rma_lanes.size() <= kMaxRmaLanes);
    (void)header_from_blob(w.header, "fuzz welcome");  // what ControlCluster does with it
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t side = in.byte();
  const bool server = (side & 1) != 0;
  const std::vector<char> stream = in.rest();
  std::vector<char> buf;
  size_t at = 0, piece = 1 + (side >> 1);
  bool first = true;
  try {
    while (at < stream.size()) {
      const size_t n = std::min(piece, stream.size() - at);
      buf.insert(buf.end(), stream.begin() + static_cast<ptrdiff_t>(at), stream.begin() + static_cast<ptrdiff_t>(at + n));
      at += n;
      // read_available's bound: a peer that sends more than two frames' worth unframed is dropped.
      if (buf.size() > 2 * (sizeof(ControlFrame) + kMaxPayload)) break;
      ControlFrame f{};
      std::vector<char> payload;
      while (take_frame(buf, f, payload, "fuzz")) {
        try {
          handle(server, first, f, payload);
        } catch (const FabricError&) {
          if (first) break;  // a bad hello or welcome ends the connection
        }
        first = false;
      }
    }
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  return 0;
}
