#include "meshtrain/core/device.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>

#include "meshtrain/core/error.h"

namespace mt {

namespace {
std::atomic<Device::Kind> g_default_kind{Device::Kind::cpu};
std::atomic<int> g_default_index{0};
thread_local bool t_scoped = false;
thread_local Device t_scoped_device;

std::string available_devices() {
  const int n = cuda_runtime().device_count();
  if (n == 0) return "cpu only (no GPU visible, or meshtrain built without CUDA)";
  std::string s = "cpu";
  for (int i = 0; i < n; ++i) s += ", cuda:" + std::to_string(i) + " (" + cuda_runtime().describe(i) + ")";
  return s;
}
}  // namespace

int local_gpu_index(int device_count) {
  if (device_count <= 0) return 0;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long rank = std::strtol(v, &end, 10);
    if (*end == '\0' && rank >= 0) return int(rank % device_count);
  }
  return 0;
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  const int gpus = cuda_runtime().device_count();
  if (text == "auto") return gpus > 0 ? cuda(local_gpu_index(gpus)) : cpu();
  if (text == "cuda") {
    MT_CHECK(gpus > 0, "[device] cuda is not available; this machine has ", available_devices());
    return cuda(local_gpu_index(gpus));
  }
  if (text.rfind("cuda", 0) == 0) {
    int index = 0;
    if (text.size() > 4) {
      const std::string digits = text.substr(5);
      MT_CHECK(text[4] == ':' && !digits.empty() && digits.size() < 4 &&
                   std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c); }),
               "[device] '", text, "' is not a device: use cpu, cuda, cuda:N or auto");
      index = std::stoi(digits);
    }
    MT_CHECK(index < cuda_runtime().device_count(), "[device] ", text, " is not available; this machine has ",
             available_devices());
    return cuda(index);
  }
  throw Error("[device] '" + text + "' is not a device: use cpu, cuda, cuda:N or auto");
}

Device default_device() { return {g_default_kind.load(), g_default_index.load()}; }
void set_default_device(Device device) {
  g_default_kind.store(device.kind);
  g_default_index.store(device.index);
}
Device current_device() { return t_scoped ? t_scoped_device : default_device(); }

DeviceScope::DeviceScope(Device device) : had_previous_(t_scoped), previous_(t_scoped_device) {
  t_scoped = true;
  t_scoped_device = device;
}
DeviceScope::~DeviceScope() {
  t_scoped = had_previous_;
  t_scoped_device = previous_;
}

void synchronize(Device device) {
  if (device.is_cuda()) cuda_runtime().synchronize();
}

bool capturing_device_work() { return cuda_runtime().capturing(); }

}  // namespace mt
