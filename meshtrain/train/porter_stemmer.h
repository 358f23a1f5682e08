#pragma once
// The Porter stemming algorithm (M. F. Porter, "An algorithm for suffix stripping", 1980),
// as ROUGE's optional stemmer applies it to lower-case alphanumeric tokens: steps 1a-5b of
// the published algorithm, "caresses" -> "caress", "relational" -> "relat".
#include <string>
#include <string_view>

namespace mt::train {

// The stem of a lower-case ASCII word; words of one or two letters are returned unchanged.
std::string porter_stem(std::string_view word);

}  // namespace mt::train
