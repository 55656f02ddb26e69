#include "compute/codes.hpp"

#include <faiss/IndexFlatCodes.h>
#include <faiss/IndexPQ.h>
#include <faiss/impl/DistanceComputer.h>
#include <faiss/IndexScalarQuantizer.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/io.h>
#include <faiss/index_io.h>

#include <charconv>
#include <cstring>
#include <stdexcept>

#include "common/checksum.hpp"

namespace dmhnsw::compute {

namespace {

constexpr char kMagic[8] = {'D', 'M', 'C', 'O', 'D', 'E', 'S', '1'};

// The SQ8 kernels: one clone per instruction set, chosen when the program loads (the
// reductions vectorize because this unit is compiled with reassociation allowed:
// compute/CMakeLists.txt).
__attribute__((target_clones("avx512f", "avx2", "default"))) float sq8_l2(const float* a, const float* s,
                                                                          const uint8_t* c, size_t d) {
  float sum = 0;
  for (size_t i = 0; i < d; ++i) {
    const float t = a[i] - static_cast<float>(c[i]) * s[i];
    sum += t * t;
  }
  return sum;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) float sq8_dot(const float* b, const uint8_t* c,
                                                                           size_t d) {
  float sum = 0;
  for (size_t i = 0; i < d; ++i) sum += b[i] * static_cast<float>(c[i]);
  return sum;
}

faiss::MetricType faiss_metric(Metric m) { return m == Metric::IP ? faiss::METRIC_INNER_PRODUCT : faiss::METRIC_L2; }

}  // namespace

std::string CodesSpec::to_string() const {
  switch (kind) {
    case CodeKind::None:
      return "none";
    case CodeKind::Sq8:
      return "sq8";
    case CodeKind::Pq:
      return "pq:" + std::to_string(pq_m);
  }
  return "?";
}

CodesSpec parse_codes(const std::string& text) {
  CodesSpec s;
  if (text == "none" || text.empty()) return s;
  if (text == "sq8") {
    s.kind = CodeKind::Sq8;
    return s;
  }
  if (text.rfind("pq:", 0) == 0) {
    const std::string m = text.substr(3);
    uint32_t v = 0;
    const auto [end, ec] = std::from_chars(m.data(), m.data() + m.size(), v);
    if (ec == std::errc() && end == m.data() + m.size() && v >= 1 && v <= 65536) {
      s.kind = CodeKind::Pq;
      s.pq_m = v;
      return s;
    }
  }
  throw std::invalid_argument("--codes '" + text + "': use none, sq8 or pq:M (M sub-quantizers, dividing the dimension)");
}

CodeDistance::CodeDistance(std::unique_ptr<faiss::FlatCodesDistanceComputer> dc, bool ip)
    : dc_(std::move(dc)), ip_(ip) {}
CodeDistance::~CodeDistance() = default;

CodeDistance::CodeDistance(const float* q, const std::vector<float>& trained, uint32_t dim, bool ip) : ip_(ip) {
  a_.resize(dim);
  s_.resize(dim);
  for (uint32_t i = 0; i < dim; ++i) {
    const float vmin = trained[i], step = trained[dim + i] / 255.0f;
    if (ip) {  // <q, x> = sum q_i (vmin_i + 0.5 step_i) + sum (q_i step_i) c_i
      k_ += q[i] * (vmin + 0.5f * step);
      a_[i] = q[i] * step;
    } else {  // q_i - x_i = (q_i - vmin_i - 0.5 step_i) - c_i step_i
      a_[i] = q[i] - vmin - 0.5f * step;
      s_[i] = step;
    }
  }
}

float CodeDistance::operator()(const uint8_t* code) const {
  if (!dc_) return ip_ ? 1.0f - (k_ + sq8_dot(a_.data(), code, a_.size())) : sq8_l2(a_.data(), s_.data(), code, a_.size());
  const float d = dc_->distance_to_code(code);
  return ip_ ? 1.0f - d : d;
}

Quantizer::~Quantizer() = default;

std::unique_ptr<CodeDistance> Quantizer::distance_to(const float* q) const {
  if (const auto* sq = dynamic_cast<const faiss::IndexScalarQuantizer*>(index_.get());
      sq != nullptr && sq->sq.trained.size() == 2 * size_t{dim_})  // per-dimension ranges (QT_8bit)
    return std::make_unique<CodeDistance>(q, sq->sq.trained, dim_, metric_ == Metric::IP);
  const auto* flat = dynamic_cast<const faiss::IndexFlatCodes*>(index_.get());
  std::unique_ptr<faiss::FlatCodesDistanceComputer> dc(flat->get_FlatCodesDistanceComputer());
  dc->set_query(q);
  return std::make_unique<CodeDistance>(std::move(dc), metric_ == Metric::IP);
}

std::shared_ptr<const Quantizer> Quantizer::train_spread(const CodesSpec& spec, size_t n, uint32_t dim, Metric metric,
                                                         const std::function<const float*(size_t)>& row) {
  const size_t rows = std::min(n, kCodesTrainRows);
  std::vector<float> sample(rows * dim);
  for (size_t j = 0; j < rows; ++j) std::memcpy(sample.data() + j * dim, row(j * n / rows), sizeof(float) * dim);
  return train(spec, sample.data(), rows, dim, metric);
}

std::shared_ptr<const Quantizer> Quantizer::train(const CodesSpec& spec, const float* x, size_t n, uint32_t dim,
                                                  Metric metric) {
  if (!spec.enabled()) throw std::invalid_argument("--codes none: nothing to train");
  if (n == 0) throw std::invalid_argument("--codes " + spec.to_string() + ": no vectors to train on");
  std::shared_ptr<Quantizer> q(new Quantizer());
  q->spec_ = spec;
  q->dim_ = dim;
  q->metric_ = metric;
  if (spec.kind == CodeKind::Sq8) {
    auto idx = std::make_unique<faiss::IndexScalarQuantizer>(static_cast<int>(dim), faiss::ScalarQuantizer::QT_8bit,
                                                              faiss_metric(metric));
    idx->train(static_cast<faiss::Index::idx_t>(n), x);
    q->code_size_ = idx->sq.code_size;
    q->index_ = std::move(idx);
  } else {
    if (dim % spec.pq_m != 0)
      throw std::invalid_argument("--codes " + spec.to_string() + ": " + std::to_string(spec.pq_m) +
                                  " sub-quantizers do not divide the dimension " + std::to_string(dim));
    if (n < 256)
      throw std::invalid_argument("--codes " + spec.to_string() + ": PQ trains 256 centroids per sub-space, " +
                                  std::to_string(n) + " vectors are too few");
    auto idx = std::make_unique<faiss::IndexPQ>(static_cast<int>(dim), spec.pq_m, 8, faiss_metric(metric));
    idx->pq.verbose = false;
    idx->pq.cp.min_points_per_centroid = 1;  // a small sample is what --codes trains on; no warning for it
    idx->train(static_cast<faiss::Index::idx_t>(n), x);
    q->code_size_ = idx->pq.code_size;
    q->index_ = std::move(idx);
  }
  return q;
}

std::vector<char> Quantizer::serialize() const {
  faiss::VectorIOWriter w;
  faiss::write_index(index_.get(), &w);
  CodesHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kCodesVersion;
  h.kind = static_cast<uint32_t>(spec_.kind);
  h.dim = dim_;
  h.code_size = static_cast<uint32_t>(code_size_);
  h.metric = metric_ == Metric::IP ? 1 : 0;
  h.payload_bytes = w.data.size();
  h.checksum = checksum64(w.data.data(), w.data.size());
  std::vector<char> out(sizeof h + w.data.size());
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, w.data.data(), w.data.size());
  return out;
}

std::shared_ptr<const Quantizer> Quantizer::load(const char* block, size_t len, const std::string& where,
                                                 uint64_t offset) {
  auto bad = [&](size_t field, const std::string& what) {
    return std::runtime_error(where + ": codes block at offset " + std::to_string(offset + field) + ": " + what);
  };
  CodesHeader h;
  if (len < sizeof h) throw bad(0, std::to_string(len) + " bytes, shorter than its header");
  std::memcpy(&h, block, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) throw bad(0, "no DMCODES1 magic");
  if (h.version != kCodesVersion)
    throw bad(offsetof(CodesHeader, version), "version " + std::to_string(h.version) + " (this build reads " +
                                                  std::to_string(kCodesVersion) + ")");
  if (h.kind != static_cast<uint32_t>(CodeKind::Sq8) && h.kind != static_cast<uint32_t>(CodeKind::Pq))
    throw bad(offsetof(CodesHeader, kind), "kind " + std::to_string(h.kind));
  if (h.dim == 0 || h.dim > 65536) throw bad(offsetof(CodesHeader, dim), "dimension " + std::to_string(h.dim));
  if (h.metric > 1) throw bad(offsetof(CodesHeader, metric), "metric " + std::to_string(h.metric));
  if (h.payload_bytes > len - sizeof h || h.payload_bytes > kMaxCodesBlock)
    throw bad(offsetof(CodesHeader, payload_bytes),
              "payload of " + std::to_string(h.payload_bytes) + " bytes in a block of " + std::to_string(len));
  const char* payload = block + sizeof h;
  if (checksum64(payload, h.payload_bytes) != h.checksum)
    throw bad(offsetof(CodesHeader, checksum), "checksum mismatch (the quantizer's bytes are corrupted)");
  faiss::VectorIOReader r;
  r.data.assign(reinterpret_cast<const uint8_t*>(payload), reinterpret_cast<const uint8_t*>(payload) + h.payload_bytes);
  std::unique_ptr<faiss::Index> idx;
  try {
    idx.reset(faiss::read_index(&r));
  } catch (const faiss::FaissException& e) {
    throw bad(sizeof h, std::string("Faiss cannot read the quantizer: ") + e.what());
  }
  std::shared_ptr<Quantizer> q(new Quantizer());
  q->dim_ = h.dim;
  q->metric_ = h.metric == 1 ? Metric::IP : Metric::L2;
  if (auto* sq = dynamic_cast<faiss::IndexScalarQuantizer*>(idx.get());
      sq != nullptr && h.kind == static_cast<uint32_t>(CodeKind::Sq8) && sq->sq.qtype == faiss::ScalarQuantizer::QT_8bit) {
    q->spec_.kind = CodeKind::Sq8;
    q->code_size_ = sq->sq.code_size;
  } else if (auto* pq = dynamic_cast<faiss::IndexPQ*>(idx.get());
             pq != nullptr && h.kind == static_cast<uint32_t>(CodeKind::Pq) && pq->pq.nbits == 8) {
    q->spec_.kind = CodeKind::Pq;
    q->spec_.pq_m = static_cast<uint32_t>(pq->pq.M);
    q->code_size_ = pq->pq.code_size;
  } else {
    throw bad(offsetof(CodesHeader, kind), "the payload is not the quantizer kind " + std::to_string(h.kind) + " names");
  }
  if (static_cast<uint32_t>(idx->d) != h.dim || q->code_size_ != h.code_size)
    throw bad(offsetof(CodesHeader, dim), "the payload's dimension " + std::to_string(idx->d) + " / code size " +
                                              std::to_string(q->code_size_) + " differ from the header's");
  q->index_ = std::move(idx);
  return q;
}

void Quantizer::encode(const float* x, size_t n, uint8_t* codes) const {
  index_->sa_encode(static_cast<faiss::Index::idx_t>(n), x, codes);
}

void Quantizer::decode(const uint8_t* codes, size_t n, float* x) const {
  index_->sa_decode(static_cast<faiss::Index::idx_t>(n), codes, x);
}

}  // namespace dmhnsw::compute
