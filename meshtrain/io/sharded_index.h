#pragma once
// Sharded checkpoints: an index JSON ({"weight_map": {tensor: shard file}}, as HF writes
// model.safetensors.index.json and pytorch_model.bin.index.json) and its shard files, each
// read by the format's own loader. Every shard must hold exactly the tensors the map gives it.
#include <functional>
#include <string>

#include "meshtrain/autodiff/params.h"

namespace mt::io {

// `tag` prefixes errors ("safetensors", "torch"); errors name the index and the shard.
Params load_sharded_checkpoint(const std::string& index_path, const std::function<Params(const std::string&)>& load_shard,
                               const char* tag);

}  // namespace mt::io
