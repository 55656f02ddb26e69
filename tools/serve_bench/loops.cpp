// serve-bench's clients: their channels, the connection check at start, and the closed- and
// open-loop request loops each client thread runs.
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <thread>

#include "tools/serve_bench/serve_bench.hpp"

namespace dmhnsw::serve_bench {

namespace {

std::chrono::system_clock::time_point system_deadline(double seconds_from_now) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds_from_now));
}

struct AsyncCall {
  grpc::ClientContext ctx;
  pb::SearchRequest req;
  pb::SearchResponse resp;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::SearchResponse>> rpc;
  uint64_t r = 0;
  Clock::time_point intended{}, sent{};
};

}  // namespace

std::shared_ptr<grpc::Channel> make_channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own, not one shared by all channels
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

void prepare(grpc::ClientContext& ctx, const Options& o) {
  if (!o.token.empty()) ctx.AddMetadata("dmhnsw-token", o.token);
  ctx.set_deadline(system_deadline(o.deadline));
}

void connect_all(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const std::vector<std::string>& names,
                 const Options& o) {
  for (const auto& ch : channels) ch->GetState(true);  // start connecting
  const auto deadline = system_deadline(o.connect_timeout);
  for (size_t i = 0; i < channels.size(); ++i) {
    if (channels[i]->WaitForConnected(deadline)) continue;
    // Why: a call that does not wait for the connection fails with gRPC's own reason.
    auto stub = pb::Search::NewStub(channels[i]);
    grpc::ClientContext ctx;
    if (!o.token.empty()) ctx.AddMetadata("dmhnsw-token", o.token);
    ctx.set_deadline(system_deadline(1.0));
    pb::InfoResponse info;
    const grpc::Status s = stub->Info(&ctx, pb::InfoRequest{}, &info);
    std::string why = s.ok() ? "connected only after the deadline"
                             : std::string(code_name(s.error_code())) + ": " + s.error_message();
    char t[32];
    std::snprintf(t, sizeof t, "%g", o.connect_timeout);
    throw std::runtime_error("--target " + names[i] + ": no connection within " + t + " s (--connect-timeout): " + why);
  }
}

void closed_loop(Client& cl, const Plan& plan, const Options& o, std::atomic<uint64_t>& next, Clock::time_point t0,
                 Clock::time_point stop_at, Stats& st) {
  std::this_thread::sleep_until(t0);
  pb::SearchRequest req;
  pb::SearchResponse resp;
  for (;;) {
    if (Clock::now() >= stop_at) break;
    const uint64_t r = next.fetch_add(1);
    if (r >= plan.request_limit) break;
    plan.fill(req, r);
    resp.Clear();
    grpc::ClientContext ctx;
    prepare(ctx, o);
    const auto s0 = Clock::now();
    const grpc::Status s = cl.stub->Search(&ctx, req, &resp);
    const auto s1 = Clock::now();
    ++st.sent;
    st.last_send = s0;
    st.last_done = s1;
    st.finish(plan, r, s, resp, us(s1 - s0));
    // A target gone (connection refused or closed) fails every call at once: not a busy loop.
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE)
      std::this_thread::sleep_until(std::min(stop_at, Clock::now() + std::chrono::milliseconds(10)));
  }
}

void open_loop(Client& cl, size_t index, const Plan& plan, const Options& o, std::atomic<uint64_t>& next_request,
               Clock::time_point t0, Clock::time_point stop_at, Stats& st) {
  const double client_rate = o.rate / o.clients;
  const bool poisson = o.arrival == "poisson";
  Rng rng(o.seed * 7919 + index);
  auto gap = [&]() -> Clock::duration {
    const double s = poisson ? -std::log1p(-rng.uniform01()) / client_rate : 1.0 / client_rate;
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  // Fixed: client c sends at t0 + (c + 1 + i * clients) / rate, the clients interleaved.
  Clock::time_point next =
      poisson ? t0 + gap()
              : t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>((index + 1) / o.rate));
  grpc::CompletionQueue cq;
  uint64_t in_flight = 0;
  bool sending = true;

  auto complete = [&](void* tag) {
    std::unique_ptr<AsyncCall> call(static_cast<AsyncCall*>(tag));
    const auto done = Clock::now();
    --in_flight;
    st.last_done = std::max(st.last_done, done);
    const uint64_t ok_before = st.ok;
    st.finish(plan, call->r, call->status, call->resp, us(done - call->intended));
    if (st.ok > ok_before) st.service_us.push_back(us(done - call->sent));
  };

  for (;;) {
    // Everything due, as long as the in-flight cap allows (a short burst, then answers).
    for (int burst = 0; sending && burst < 16; ++burst) {
      const auto now = Clock::now();
      if (next >= stop_at || now >= stop_at) {  // --seconds: the end of the schedule, or of the time
        sending = false;
        for (; next < stop_at && next_request.fetch_add(1) < plan.request_limit; next += gap()) ++st.not_sent;
        break;
      }
      if (now < next) break;
      if (in_flight >= o.max_in_flight) {
        st.cap_hit = true;
        break;
      }
      const uint64_t r = next_request.fetch_add(1);
      if (r >= plan.request_limit) {
        sending = false;
        break;
      }
      auto call = std::make_unique<AsyncCall>();
      call->r = r;
      call->intended = next;
      plan.fill(call->req, r);
      prepare(call->ctx, o);
      call->sent = Clock::now();
      call->rpc = cl.stub->PrepareAsyncSearch(&call->ctx, call->req, &cq);
      call->rpc->StartCall();
      AsyncCall* raw = call.release();
      raw->rpc->Finish(&raw->resp, &raw->status, raw);
      ++in_flight;
      ++st.sent;
      st.last_send = raw->sent;
      st.lag_us.push_back(us(raw->sent - raw->intended));
      next += gap();
    }
    if (!sending && in_flight == 0) break;
    // Answers until the next send is due (or a while, when nothing is to be sent now).
    const auto now = Clock::now();
    Clock::duration wait = std::chrono::milliseconds(50);
    if (sending && in_flight < o.max_in_flight) wait = std::min(wait, next - now);
    wait = std::max(wait, Clock::duration::zero());
    auto deadline =
        std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(wait);
    const auto wake = now + wait;
    for (;;) {
      void* tag = nullptr;
      bool ok = false;
      const auto ns = cq.AsyncNext(&tag, &ok, deadline);
      if (ns != grpc::CompletionQueue::GOT_EVENT) {
        // How late the thread came back: the generator's own stalls (scheduling, gRPC's poller).
        st.max_wake_late_us = std::max(st.max_wake_late_us, us(Clock::now() - wake));
        break;
      }
      complete(tag);
      if (sending && Clock::now() >= next) break;  // a send is due
      deadline = std::chrono::system_clock::now();  // then only what is already there
    }
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) delete static_cast<AsyncCall*>(tag);
}

}  // namespace dmhnsw::serve_bench
