#include "apps/meshtrain/eval_outputs.h"

#include <iostream>
#include <string>

#include "meshtrain/io/json.h"
#include "meshtrain/io/mapped_file.h"

namespace mt::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

void write_eval_outputs(const fs::path& out, const std::vector<json>& predictions, int64_t step,
                        const train::FitResult& fit) {
  std::string lines;
  for (const json& row : predictions) lines += row.dump() + "\n";
  io::write_file_atomic((out / "predictions.jsonl").string(), lines);
  json results = {{"step", step}};
  if (!fit.evals.empty())
    for (const auto& [k, v] : fit.evals.back()) results[k] = v;
  const fs::path best = out / "checkpoints" / "best" / "meta.json";
  if (fs::exists(best)) results["best"] = io::read_json_file(best.string()).value("best", json());
  io::write_file_atomic((out / "eval_results.json").string(), results.dump(2) + "\n");
  const fs::path model_dir = out / "model";
  std::cout << "eval results: " << results.dump() << "\npredictions in " << (out / "predictions.jsonl").string()
            << (fs::exists(model_dir) ? ", model in " + model_dir.string() : std::string()) << "\n";
}

}  // namespace mt::cli
