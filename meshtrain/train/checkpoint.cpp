#include "meshtrain/train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "meshtrain/backend/strided_copy.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/io/json.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/io/safetensors.h"

namespace mt::train {

namespace fs = std::filesystem;
using dist::PartitionSpec;
using json = nlohmann::json;

namespace {

// A rank owns its block of an array when it is the first replica: coordinate 0 on every
// mesh axis the layout does not split.
bool owns_block(const dist::Mesh& mesh, const PartitionSpec& spec) {
  std::vector<std::string> used = spec.used_axes();
  for (const std::string& axis : mesh.axis_names())
    if (std::find(used.begin(), used.end(), axis) == used.end() && mesh.axis_index(axis) != 0) return false;
  return true;
}

// Adds `group`'s arrays to this rank's tensors and their descriptions to meta.
void collect(const std::string& group, const Params& arrays, const dist::Mesh& mesh, Params& tensors,
             std::map<std::string, std::string>& offsets, json& meta) {
  for (const auto& [path, value] : arrays) {
    Array a = value;
    const dist::Sharding* s = dist::sharding_of(a);
    PartitionSpec spec = s ? s->spec : PartitionSpec{};
    if (!spec.partial.empty()) {  // a partial sum is not a value: store the total
      a = dist::redistribute(a, mesh, spec.without_partial());
      spec = spec.without_partial();
    }
    // A list, not an object: JSON objects lose the parameters' order.
    meta[group].push_back(
        {{"path", path}, {"shape", a.shape().dims()}, {"dtype", dtype_name(a.dtype())}, {"spec", spec.str()}});
    if (!owns_block(mesh, spec) && dist::is_sharded(a)) continue;
    if (!dist::is_sharded(a) && mesh.comm().rank() != 0) continue;  // plain arrays: rank 0 writes
    std::vector<int64_t> off(size_t(a.ndim()), 0);
    if (s && dist::is_sharded(a)) off = dist::Sharding{mesh, spec}.local_offsets(a.shape());
    const std::string key = group + "/" + path;
    tensors.set(key, dist::local_view(a).detach());
    offsets[key] = json(off).dump();
  }
}

}  // namespace

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

CheckpointManager::CheckpointManager(std::string dir, int keep_last) : dir_(std::move(dir)), keep_last_(keep_last) {}

StagedCheckpoint CheckpointManager::stage(const CheckpointState& state, const dist::Mesh& mesh,
                                          const std::string& name, const json& extra_meta) const {
  dist::Communicator& comm = mesh.comm();
  StagedCheckpoint staged;
  staged.name = name;
  staged.final_dir = (fs::path(dir_) / name).string();
  staged.tmp_dir = (fs::path(dir_) / (".tmp_" + name)).string();
  staged.file = (fs::path(staged.tmp_dir) / ("rank_" + std::to_string(comm.rank()) + ".safetensors")).string();
  if (comm.rank() == 0) {
    fs::remove_all(staged.tmp_dir);
    fs::create_directories(staged.tmp_dir);
  }
  comm.barrier();
  staged.meta = {{"step", state.step}, {"epoch", state.epoch}, {"mesh", mesh.str()}, {"world_size", comm.size()},
                 {"params", json::array()}, {"opt_state", json::array()}, {"extra", state.extra}};
  for (auto it = extra_meta.begin(); it != extra_meta.end(); ++it) staged.meta[it.key()] = it.value();
  collect("params", state.params, mesh, staged.tensors, staged.offsets, staged.meta);
  collect("opt_state", state.opt_state, mesh, staged.tensors, staged.offsets, staged.meta);
  return staged;
}

void CheckpointManager::write_files(const StagedCheckpoint& staged) {
  io::save_safetensors(staged.file, staged.tensors, staged.offsets);
}

std::string CheckpointManager::commit(const StagedCheckpoint& staged, const dist::Mesh& mesh) const {
  dist::Communicator& comm = mesh.comm();
  comm.barrier();  // every rank's file is complete
  if (comm.rank() == 0) {
    // On disk (fsynced, with its directory) before the rename makes the checkpoint visible: a
    // crash must not leave a checkpoint whose meta.json is empty.
    io::write_file_atomic((fs::path(staged.tmp_dir) / "meta.json").string(), staged.meta.dump(2) + "\n",
                          "checkpoint");
    // The old checkpoint of the same name goes only once the new one is complete.
    const std::string old_dir = staged.final_dir + ".old";
    fs::remove_all(old_dir);
    if (fs::exists(staged.final_dir)) fs::rename(staged.final_dir, old_dir);
    fs::rename(staged.tmp_dir, staged.final_dir);
    io::sync_directory(fs::path(staged.final_dir).parent_path().string());  // the rename, before pruning
    fs::remove_all(old_dir);
    if (staged.prune && keep_last_ > 0) {
      std::vector<std::string> done = all();
      for (size_t i = 0; i + size_t(keep_last_) < done.size(); ++i) fs::remove_all(done[i]);
    }
  }
  comm.barrier();
  return staged.final_dir;
}

std::string CheckpointManager::save(const CheckpointState& state, const dist::Mesh& mesh) {
  StagedCheckpoint staged = stage(state, mesh, step_name(state.step), json::object());
  staged.prune = true;
  write_files(staged);
  return commit(staged, mesh);
}

BestMetric BestMetric::parse(const std::string& spec) {
  const bool max = spec.rfind("max:", 0) == 0, min = spec.rfind("min:", 0) == 0;
  MT_CHECK((max || min) && spec.size() > 4, "[trainer] save_best_by must look like 'max:accuracy' or 'min:eval_loss', got '",
           spec, "'");
  return {spec.substr(4), max ? Mode::max : Mode::min};
}

bool BestMetric::improves(double value, double previous) const {
  return mode == Mode::max ? value > previous : value < previous;
}

bool CheckpointManager::beats_best(const BestMetric& metric, double value) const {
  // A NaN or infinite metric (a diverged run, a constant prediction's correlation) is never
  // the best; JSON would store it as null.
  if (!std::isfinite(value)) return false;
  const fs::path meta_path = fs::path(dir_) / "best" / "meta.json";
  if (!fs::exists(meta_path)) return true;
  json old = io::read_json_file(meta_path.string());
  return !(old.contains("best") && old["best"].value("metric", "") == metric.name && old["best"].contains("value") &&
           old["best"]["value"].is_number() && !metric.improves(value, old["best"]["value"].get<double>()));
}

json CheckpointManager::best_meta(const BestMetric& metric, double value) {
  return {{"best", {{"metric", metric.name}, {"value", value}, {"mode", metric.mode_name()}}}};
}

bool CheckpointManager::save_best(const CheckpointState& state, const dist::Mesh& mesh, const BestMetric& metric,
                                  double value) {
  if (!beats_best(metric, value)) return false;
  StagedCheckpoint staged = stage(state, mesh, "best", best_meta(metric, value));
  write_files(staged);
  commit(staged, mesh);
  return true;
}

namespace {
// A checkpoint counts once its meta.json exists and parses: one cut short by a crash before
// meta.json was written whole (checkpoints of older builds wrote it without a sync) is not
// resumed from, and the one before it is.
bool meta_is_whole(const std::string& path) {
  std::ifstream in(path);
  return in && !json::parse(in, nullptr, false).is_discarded();
}
}  // namespace

std::vector<std::string> CheckpointManager::all() const {
  std::vector<std::string> out;
  if (!fs::exists(dir_)) return out;
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string n = e.path().filename().string();
    // Exactly step_<8 digits>: leftovers of an interrupted replace (step_N.old) are not checkpoints.
    const bool named = n.size() == 13 && n.rfind("step_", 0) == 0 &&
                       std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (e.is_directory() && named && meta_is_whole((e.path() / "meta.json").string())) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> CheckpointManager::latest() const {
  std::vector<std::string> done = all();
  if (done.empty()) return std::nullopt;
  return done.back();
}

namespace {
// The saved entry's path, shape and dtype, read from meta.json.
struct SavedEntry {
  std::string path;
  Shape shape;
  DType dtype;
};

SavedEntry saved_entry(const json& entry, const std::string& group, const fs::path& meta_path) {
  try {
    return {entry.at("path").get<std::string>(), Shape(entry.at("shape").get<std::vector<int64_t>>()),
            dtype_from_name(entry.at("dtype").get<std::string>())};
  } catch (const json::exception& e) {
    throw Error(std::string("[checkpoint] ") + meta_path.string() + ": bad entry in '" + group + "': " + e.what());
  }
}

// The live array `into` offers for an entry when the saved values can be written into its
// buffer: on the CPU, of the saved shape and dtype.
Array live_target(const IntoFn& into, const std::string& group, const SavedEntry& e) {
  if (!into) return Array();
  Array live = into(group, e.path);
  if (!live.defined() || !dist::local_view(live).device().is_cpu()) return Array();
  return live;
}
}  // namespace

CheckpointState CheckpointManager::restore(const std::string& path, const dist::Mesh& mesh, const SpecFn& spec_for,
                                           const IntoFn& into) {
  const fs::path meta_path = fs::path(path) / "meta.json";
  MT_CHECK(fs::exists(meta_path), "[checkpoint] ", path, " is not a complete checkpoint (no meta.json)");
  json meta = io::read_json_file(meta_path.string());
  CheckpointState state;
  try {
    state.step = meta.at("step").get<int64_t>();
    state.epoch = meta.at("epoch").get<int64_t>();
    state.extra = meta.value("extra", json::object());
  } catch (const json::exception& e) {
    throw Error(std::string("[checkpoint] ") + meta_path.string() + ": " + e.what());
  }
  const int saved_ranks = meta.value("world_size", 1);
  // Every rank reads every file: the blocks it needs may come from any saved rank.
  std::vector<io::SafetensorsFile> files;
  for (int r = 0; r < saved_ranks; ++r) {
    const fs::path f = fs::path(path) / ("rank_" + std::to_string(r) + ".safetensors");
    MT_CHECK(fs::exists(f), "[checkpoint] ", path, ": missing ", f.filename().string(), " (saved by ", saved_ranks,
             " ranks)");
    files.push_back(io::SafetensorsFile::open(f.string()));
  }
  // Nothing is written into a live array unless every one offered matches its entry; else the
  // arrays are restored beside them and the caller's checks say what differs.
  bool write_into = bool(into);
  for (const std::string group : {"params", "opt_state"})
    for (const json& entry : meta.value(group, json::array())) {
      if (!write_into) break;
      const SavedEntry e = saved_entry(entry, group, meta_path);
      const Array live = live_target(into, group, e);
      write_into = !live.defined() || (live.shape() == e.shape && live.dtype() == e.dtype);
    }
  for (const std::string group : {"params", "opt_state"}) {
    Params& out = group == "params" ? state.params : state.opt_state;
    if (!meta.contains(group)) continue;
    for (const json& entry : meta[group]) {
      const SavedEntry e = saved_entry(entry, group, meta_path);
      const std::string& p = e.path;
      const Shape& shape = e.shape;
      const DType dtype = e.dtype;
      const PartitionSpec spec = spec_for ? spec_for(group, p) : PartitionSpec{};
      const Array live = write_into ? live_target(into, group, e) : Array();
      // A replicated live array takes the blocks straight into its buffer; a sharded one gets
      // its block of the whole tensor below (one tensor's whole copy at a time).
      const bool direct = live.defined() && !live.distributed() && dist::Sharding{mesh, spec}.is_trivial();
      Array host = direct ? live : Array::zeros(shape, dtype, Device::cpu());
      int64_t covered = 0;
      const std::string key = group + "/" + p;
      for (const io::SafetensorsFile& f : files) {
        if (!f.contains(key)) continue;
        Array block = f.get(key);
        MT_CHECK(block.dtype() == dtype && block.ndim() == shape.ndim(), "[checkpoint] ", f.path(), ": '", key,
                 "' is ", block.str(), ", meta.json says ", dtype_name(dtype), shape.str());
        auto mit = f.metadata().find(key);
        MT_CHECK(mit != f.metadata().end(), "[checkpoint] ", f.path(), ": no block offsets for '", key, "'");
        std::vector<int64_t> off = json::parse(mit->second).get<std::vector<int64_t>>();
        MT_CHECK(int(off.size()) == shape.ndim(), "[checkpoint] ", f.path(), ": bad offsets for '", key, "'");
        size_t start = 0;
        std::vector<int64_t> strides = shape.strides();
        for (int d = 0; d < shape.ndim(); ++d) {
          MT_CHECK(off[size_t(d)] >= 0 && off[size_t(d)] + block.dim(d) <= shape[d], "[checkpoint] ", f.path(),
                   ": block of '", key, "' at ", mit->second, " lies outside ", shape.str());
          start += size_t(off[size_t(d)] * strides[size_t(d)]);
        }
        const Array block_host = block.to(Device::cpu());
        cpu::strided_copy(block_host.raw(), block.shape().strides(), static_cast<char*>(host.raw()) + start * dtype_size(dtype),
                          strides, block.shape().dims(), dtype_size(dtype));
        covered += block.numel();
        f.release(key);  // copied out: the file's pages need not stay in this process
      }
      MT_CHECK(covered == shape.numel(), "[checkpoint] ", path, ": the blocks of '", key, "' cover ", covered, " of ",
               shape.numel(), " elements");
      if (direct) {
        out.set(p, live);
        continue;
      }
      Array placed = dist::shard(host.to(current_device()), mesh, spec, p);
      host = Array();
      if (live.defined() && dist::local_view(live).shape() == dist::local_view(placed).shape() &&
          dist::local_view(placed).device().is_cpu()) {
        const Array from = dist::local_view(placed), to = dist::local_view(live);
        std::memcpy(to.raw(), from.raw(), to.nbytes());
        placed = live;
      }
      out.set(p, placed);
    }
  }
  return state;
}

}  // namespace mt::train
