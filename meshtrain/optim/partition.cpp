#include "meshtrain/optim/partition.h"

#include <memory>
#include <mutex>
#include <regex>
#include <unordered_map>

#include "meshtrain/core/error.h"

namespace mt::optim {

namespace {

struct CompiledRules {
  std::vector<std::regex> patterns;
  std::vector<PartitionRule> rules;
  // Owners already resolved: each step asks for every parameter, and regexes are slow.
  mutable std::mutex mutex;
  mutable std::unordered_map<std::string, size_t> owners;
  // The index of the rule that owns `path`; throws naming it when none matches.
  size_t owner(const std::string& path) const {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (auto it = owners.find(path); it != owners.end()) return it->second;
    }
    for (size_t i = 0; i < patterns.size(); ++i)
      if (std::regex_match(path, patterns[i])) {
        std::lock_guard<std::mutex> lock(mutex);
        owners.emplace(path, i);
        return i;
      }
    std::string all;
    for (const PartitionRule& r : rules) all += (all.empty() ? "'" : ", '") + r.pattern + "'";
    throw Error("[partition] parameter '" + path + "' matches no rule (" + all + ")");
  }
};

}  // namespace

Transform freeze() {
  Transform t;
  t.init = [](const Params&) { return Params{}; };
  t.update = [](const Params&, Params&, const Params&) { return Params{}; };
  t.host_step = [](Params&) {};
  t.frozen = [](const std::string&) { return true; };
  return t;
}

Transform partition(std::vector<PartitionRule> rules) {
  MT_CHECK(!rules.empty(), "[partition] needs at least one rule");
  auto compiled = std::make_shared<CompiledRules>();
  for (const PartitionRule& r : rules) {
    try {
      compiled->patterns.emplace_back(r.pattern);
    } catch (const std::regex_error& e) {
      throw Error("[partition] invalid regex '" + r.pattern + "': " + e.what());
    }
  }
  compiled->rules = std::move(rules);
  // Params split by owning rule, each in the tree's order.
  auto split = [compiled](const Params& tree) {
    std::vector<Params> parts(compiled->rules.size());
    for (const auto& [path, v] : tree) parts[compiled->owner(path)].set(path, v);
    return parts;
  };
  Transform t;
  t.frozen = [compiled](const std::string& path) {
    const Transform& owner = compiled->rules[compiled->owner(path)].transform;
    return is_frozen(owner, path);
  };
  t.init = [compiled, split](const Params& params) {
    std::vector<Params> parts = split(params);
    Params s;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].empty()) continue;
      for (const auto& [path, v] : compiled->rules[i].transform.init(parts[i])) s.set(std::to_string(i) + "." + path, v);
    }
    return s;
  };
  bool all_capturable = true;
  for (const PartitionRule& r : compiled->rules) all_capturable = all_capturable && capturable(r.transform);
  if (all_capturable)
    t.host_step = [compiled](Params& state) {
      // A rule that owns no parameter has no state (init skipped it) and no update.
      for (size_t i = 0; i < compiled->rules.size(); ++i) {
        const std::string prefix = std::to_string(i);
        Params inner = take_subtree(state, prefix);
        if (inner.empty()) continue;
        compiled->rules[i].transform.host_step(inner);
        put_back_subtree(state, prefix, inner);
      }
    };
  t.update = [compiled, split](const Params& updates, Params& state, const Params& params) {
    std::vector<Params> parts = split(updates);
    Params out;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].empty()) continue;
      const std::string prefix = std::to_string(i);
      Params inner = take_subtree(state, prefix);
      for (const auto& [path, u] : compiled->rules[i].transform.update(parts[i], inner, params)) out.set(path, u);
      put_back_subtree(state, prefix, inner);
    }
    return out;
  };
  return t;
}

}  // namespace mt::optim
