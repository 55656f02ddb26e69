// Dataset readers (common/dataset.hpp): fvecs, bvecs, ivecs, fbin, u8bin, i8bin, ibin.
// Input: [format byte][loader byte][max_rows byte][file bytes...]. The file is written under
// the format's extension and read by one of the loaders; a loaded matrix is read in full (every
// value of every row) and its shape compared with probe()'s.
#include <algorithm>
#include <cstdint>
#include <exception>

#include "common/dataset.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;

namespace {

template <typename T>
double touch(const Matrix<T>& m) {
  double s = 0;
  for (size_t i = 0; i < m.n(); ++i)
    for (T v : m[i]) s += static_cast<double>(v);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const char* const kExt[] = {".fvecs", ".bvecs", ".ivecs", ".fbin", ".u8bin", ".i8bin", ".ibin"};
  static fuzz::TempFile files[] = {fuzz::TempFile(kExt[0]), fuzz::TempFile(kExt[1]), fuzz::TempFile(kExt[2]),
                                   fuzz::TempFile(kExt[3]), fuzz::TempFile(kExt[4]), fuzz::TempFile(kExt[5]),
                                   fuzz::TempFile(kExt[6])};
  fuzz::Input in(data, size);
  const unsigned fmt = in.byte() % 7;
  const unsigned loader = in.byte() % 6;
  const uint8_t rows = in.byte();
  const std::vector<char> body = in.rest();
  const std::string& path = files[fmt].write(body);

  LoadOptions o;
  o.max_rows = rows >= 4 ? LoadOptions::kAllRows : rows + 1u;
  o.allow_view = (rows & 0x80) == 0;
  try {
    const FileShape shape = probe(path);
    DMHNSW_FUZZ_CHECK(shape.file_size == body.size());
    auto check_shape = [&](size_t n, size_t d) {
      DMHNSW_FUZZ_CHECK(d == shape.d);
      DMHNSW_FUZZ_CHECK(n == std::min(shape.n, o.max_rows));
    };
    switch (loader) {
      case 0: {
        FloatMatrix m = load_vectors_as_float(path, o);
        check_shape(m.n(), m.d());
        touch(m);
        break;
      }
      case 1: {
        IdMatrix m = load_ids(path, o);
        check_shape(m.n(), m.d());
        touch(m);
        break;
      }
      case 2: {
        GroundTruth g = load_groundtruth(path, o);
        check_shape(g.ids.n(), g.ids.d());
        touch(g.ids);
        if (g.distances) {
          DMHNSW_FUZZ_CHECK(g.distances->n() == g.ids.n() && g.distances->d() == g.ids.d());
          touch(*g.distances);
        }
        break;
      }
      case 3: touch(load_matrix<float>(path, o)); break;
      case 4: touch(load_matrix<uint8_t>(path, o)); break;
      default: {
        if (element_type(shape.format) == ElementType::I8) touch(load_matrix<int8_t>(path, o));
        else touch(load_matrix<int32_t>(path, o));
        break;
      }
    }
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  return 0;
}
