#pragma once
#include <string>

namespace mt::train {

// This machine's host name ("localhost" when the OS gives none): event file names, trace tracks.
std::string host_name();

}  // namespace mt::train
