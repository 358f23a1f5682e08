#pragma once
// What a command that evaluates by generating (seq2seq, caption) leaves in its output
// directory after training: predictions.jsonl (one JSON object per evaluation row) and
// eval_results.json (the step, the last evaluation's metrics, the best checkpoint's metric);
// then it prints where they and the model folder are. Call on the main rank.
#include <cstdint>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/train/trainer.h"

namespace mt::cli {

void write_eval_outputs(const std::filesystem::path& out, const std::vector<nlohmann::json>& predictions, int64_t step,
                        const train::FitResult& fit);

}  // namespace mt::cli
