#include "meshtrain/core/shape.h"

#include <ostream>

#include "meshtrain/core/error.h"

namespace mt {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

int Shape::axis(int i, const char* op) const {
  int n = ndim();
  MT_CHECK(i >= -n && i < n, "[", op, "] axis ", i, " out of range for shape ", str());
  return i < 0 ? i + n : i;
}

std::vector<int64_t> Shape::strides() const {
  std::vector<int64_t> s(dims_.size());
  int64_t acc = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    s[size_t(i)] = acc;
    acc *= dims_[size_t(i)];
  }
  return s;
}

std::string Shape::str() const {
  std::string s = "(";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  if (dims_.size() == 1) s += ",";
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  int n = std::max(a.ndim(), b.ndim());
  std::vector<int64_t> out(size_t(n), 1);
  for (int i = 0; i < n; ++i) {
    int ia = a.ndim() - n + i, ib = b.ndim() - n + i;
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    MT_CHECK(da == db || da == 1 || db == 1, "[", op, "] shapes ", a.str(), " and ", b.str(),
             " do not broadcast");
    out[size_t(i)] = da == 1 ? db : da;
  }
  return Shape(std::move(out));
}

}  // namespace mt
