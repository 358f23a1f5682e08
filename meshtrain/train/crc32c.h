#pragma once
// CRC-32C (Castagnoli), the checksum of TFRecord framing (TensorBoard event files).
#include <cstddef>
#include <cstdint>

namespace mt::train {

// CRC-32C of `n` bytes; pass a previous result as `crc` to continue over more bytes.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's masked form (rotate right by 15, add a constant), which keeps the CRC of data
// that itself contains CRCs from being trivially related to them.
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace mt::train
