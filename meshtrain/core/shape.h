#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace mt {

// Dimensions of a row-major array; a scalar has no dimensions.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int ndim() const { return int(dims_.size()); }
  int64_t numel() const;
  int64_t operator[](int i) const { return dims_[size_t(i)]; }
  int64_t& operator[](int i) { return dims_[size_t(i)]; }
  // Dimension i where negative i counts from the end; throws naming `op` when out of range.
  int64_t dim(int i, const char* op = "shape") const { return dims_[size_t(axis(i, op))]; }
  // Normalizes a possibly negative axis for this rank; throws mt::Error naming `op`.
  int axis(int i, const char* op) const;

  const std::vector<int64_t>& dims() const { return dims_; }
  std::vector<int64_t> strides() const;  // row-major, in elements
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }
  std::string str() const;  // "(2, 3)"

  auto begin() const { return dims_.begin(); }
  auto end() const { return dims_.end(); }

 private:
  std::vector<int64_t> dims_;
};

std::ostream& operator<<(std::ostream& os, const Shape& s);

// NumPy broadcast of two shapes; throws mt::Error naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace mt
