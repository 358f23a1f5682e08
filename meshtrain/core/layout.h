#pragma once
// How a global array is stored across processes. The core only needs to know whether an
// array is distributed and to print its layout; the distributed layer's dist::Sharding is the
// one implementation (a mesh plus a PartitionSpec), so the core never includes dist.
#include <string>

namespace mt {

class Layout {
 public:
  virtual ~Layout() = default;
  // The whole array is stored on every rank, with no partial sums.
  virtual bool is_trivial() const = 0;
  virtual std::string str() const = 0;
};

}  // namespace mt
