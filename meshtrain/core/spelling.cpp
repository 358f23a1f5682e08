#include "meshtrain/core/spelling.h"

#include <algorithm>

namespace mt {

namespace {
std::string without_dashes(const std::string& s) { return s.substr(std::min(s.find_first_not_of('-'), s.size())); }
// The first letter of each part: "learning-rate" -> "lr", "per_device_batch_size" -> "pdbs".
std::string initials(const std::string& s) {
  std::string out;
  bool start = true;
  for (char c : s) {
    if (c == '-' || c == '_') start = true;
    else if (start) out += c, start = false;
  }
  return out;
}
}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string nearest_spelling(const std::string& word, const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& k : known) {
    size_t d = edit_distance(word, k);
    // A prefix either way ("generat" for "generate") or the initials ("--lr" for
    // "--learning-rate") are close.
    const std::string w = without_dashes(word), name = without_dashes(k);
    if (!w.empty() && (name.rfind(w, 0) == 0 || w.rfind(name, 0) == 0)) d = std::min<size_t>(d, 1);
    if (w.size() >= 2 && initials(name) == w) d = std::min<size_t>(d, 1);
    if (d < best_distance) {
      best_distance = d;
      best = k;
    }
  }
  return best;
}

}  // namespace mt
