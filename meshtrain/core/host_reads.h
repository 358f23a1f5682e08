#pragma once
// How many times array values have been read to the host: to_floats, to_doubles, to_ints and
// item, and a device array copied to the CPU. On a GPU each is a wait for the stream, which a
// training step must not have between its batch upload and its loss read (issue 45); on the
// CPU build the same calls are counted, so a step that reads nothing stays that way.
#include <cstdint>

namespace mt {

uint64_t host_read_count();

}  // namespace mt
