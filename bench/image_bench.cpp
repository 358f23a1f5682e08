// Images decoded and preprocessed per second on one core, against PIL + transformers'
// ViTImageProcessor (bench/image_bench.py, the project's .venv) on the same files, both from
// bytes in memory: decode (PNG/JPEG -> RGB), resize to 224x224 bilinear, rescale, normalize.
//   image_bench [FILE...] [--seconds S]
// Without files: the two JPEG photographs of Debian's python3-sklearn (640x427).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <omp.h>

#include "meshtrain/data/image_decode.h"
#include "meshtrain/data/image_processor.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", path.c_str());
    std::exit(2);
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Images per second of `work(i)` over the files in turn, for about `seconds`.
template <class F>
double rate(size_t files, double seconds, F&& work) {
  const auto start = Clock::now();
  int64_t done = 0;
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) work(size_t(done++) % files);
  return double(done) / std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> paths;
  double seconds = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else paths.push_back(a);
  }
  if (paths.empty()) {
    const std::string dir = "/usr/lib/python3/dist-packages/sklearn/datasets/images/";
    paths = {dir + "china.jpg", dir + "flower.jpg"};
  }
  omp_set_num_threads(1);  // per core: the loader runs one image per thread
  std::vector<std::string> bytes;
  for (const std::string& p : paths) bytes.push_back(read_bytes(p));
  const mt::data::ImageProcessorConfig config;  // ViTImageProcessor's defaults: 224x224 bilinear, mean = std = 0.5
  std::vector<mt::data::Image> decoded;
  for (size_t i = 0; i < bytes.size(); ++i) decoded.push_back(mt::data::decode_image(bytes[i], paths[i]));
  std::vector<float> out(size_t(3 * config.height * config.width));
  const double decode = rate(bytes.size(), seconds, [&](size_t i) { mt::data::decode_image(bytes[i], paths[i]); });
  const double process =
      rate(bytes.size(), seconds, [&](size_t i) { mt::data::preprocess_image(decoded[i], config, out.data()); });
  const double both = rate(bytes.size(), seconds, [&](size_t i) {
    mt::data::preprocess_image(mt::data::decode_image(bytes[i], paths[i]), config, out.data());
  });
  std::printf("meshtrain, 1 core, %zu files (%lldx%lld first): decode %.1f img/s, preprocess %.1f img/s, both %.1f img/s\n",
              paths.size(), (long long)decoded[0].width, (long long)decoded[0].height, decode, process, both);
  std::fflush(stdout);
  std::string cmd = std::string(MT_SOURCE_DIR) + "/.venv/bin/python3 " + MT_SOURCE_DIR + "/bench/image_bench.py --seconds " +
                    std::to_string(seconds);
  for (const std::string& p : paths) cmd += " " + p;
  const int rc = std::system(cmd.c_str());
  return rc == 0 ? 0 : 1;
}
