#include "meshtrain/io/sharded_index.h"

#include <filesystem>
#include <map>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/io/json.h"

namespace mt::io {

namespace fs = std::filesystem;

Params load_sharded_checkpoint(const std::string& index_path, const std::function<Params(const std::string&)>& load_shard,
                               const char* tag) {
  nlohmann::ordered_json index = read_ordered_json_file(index_path);
  auto err = [&](const auto&... parts) { return Error(detail::concat("[", tag, "] ", index_path, ": ", parts...)); };
  if (!index.is_object() || !index.contains("weight_map")) throw err("missing key '/weight_map'");
  const nlohmann::ordered_json& wm = index["weight_map"];
  if (!wm.is_object()) throw err("/weight_map must be an object of tensor name -> shard file, got ", wm.type_name());
  fs::path dir = fs::path(index_path).parent_path();

  std::map<std::string, Params> shards;
  std::vector<std::pair<std::string, std::string>> order;  // (tensor, shard) in weight_map order
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    if (!it->is_string()) throw err("/weight_map/", it.key(), " must be a shard file name, got ", it->type_name());
    std::string shard = it->get<std::string>();
    fs::path rel(shard);
    bool escapes = rel.is_absolute() || shard.empty();
    for (const auto& part : rel) escapes = escapes || part == "..";
    if (escapes) throw err("shard '", shard, "' for tensor '", it.key(), "' must be a relative path inside ", dir.string());
    order.emplace_back(it.key(), shard);
    if (shards.count(shard)) continue;
    fs::path shard_path = dir / rel;
    if (!fs::is_regular_file(shard_path))
      throw err("shard file '", shard_path.string(), "' (holding tensor '", it.key(), "') is missing");
    shards.emplace(shard, load_shard(shard_path.string()));
  }
  std::map<std::string, std::string> mapped(order.begin(), order.end());
  for (const auto& [shard, tensors] : shards) {
    for (const auto& [k, v] : tensors) {
      auto m = mapped.find(k);
      if (m == mapped.end() || m->second != shard)
        throw err("tensor '", k, "' in shard '", (dir / shard).string(), "' is ",
                  m == mapped.end() ? std::string("not listed in the weight_map") : "mapped to shard '" + m->second + "'");
    }
  }
  Params out;
  for (const auto& [key, shard] : order) {
    const Params& tensors = shards.at(shard);
    if (!tensors.contains(key))
      throw err("weight_map maps tensor '", key, "' to shard '", (dir / shard).string(), "', which does not hold it");
    out.set(key, tensors[key]);
  }
  return out;
}

}  // namespace mt::io
