#pragma once
// How many times array values have been read to the host: to_floats, to_doubles, to_ints and
// item, and a device array copied to the CPU. On a GPU each is a wait for the stream, which a
// training step must not have between its batch upload and its loss read (issue 45); on the
// CPU build the same calls are counted, so a step that reads nothing stays that way.
#include <cstdint>

namespace mt {

uint64_t host_read_count();

// How many arrays the calling thread has made from host values for the current device:
// from_vector (counted on both builds, as it would copy to a GPU) and a CPU array copied to a
// GPU. Per thread, because the data loader's threads upload the next batches while a step
// runs. A captured CUDA graph replays its copies from the host addresses it recorded, so a
// training step after warm-up must upload nothing but its batch: every other value it needs
// either lives on the device (device_constants.h) or is written before the step.
uint64_t host_upload_count();
// The calling thread's writes of host values into existing arrays (Array::write_from_host):
// the per-step values a step reads from memory (AdamW's step scalars, the dropout keys' step).
uint64_t host_write_count();

}  // namespace mt
