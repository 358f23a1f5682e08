#pragma once
// "Did you mean ...?" for names a user types: config keys, flags, commands.
#include <string>
#include <vector>

namespace mt {

// Levenshtein distance (insertions, deletions, substitutions; case-sensitive).
size_t edit_distance(const std::string& a, const std::string& b);
// The known name nearest to `word`: within a third of its length (at least 2 edits), a prefix
// either way, or the initials of its parts ("--lr" for "--learning-rate"; leading dashes are
// ignored for these); "" when none is close.
std::string nearest_spelling(const std::string& word, const std::vector<std::string>& known);

}  // namespace mt
