#pragma once
// PyTorch checkpoints as the Hub ships them (pytorch_model.bin): torch.save's zip format
// (PyTorch >= 1.6) and the legacy format before it, read through the restricted unpickler
// (pickle.h), so a file that would run code under torch.load is refused, naming the global.
// The result is the state dict: parameter name -> tensor (strided views copied contiguous).
#include <string>

#include "meshtrain/autodiff/params.h"

namespace mt::io {

// One .bin file, either format. Errors name the file and what is wrong.
Params load_torch_checkpoint(const std::string& path);

// A model directory's pytorch_model.bin, or its shards through pytorch_model.bin.index.json.
Params load_torch_checkpoint_dir(const std::string& dir);

}  // namespace mt::io
