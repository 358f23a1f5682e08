#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace mt {

// Every user-facing failure is an mt::Error whose message starts with "[op]" and
// names the offending shapes, paths or files.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace mt

// MT_CHECK(cond, "[op] ", "message parts", shape) throws mt::Error when cond is false.
#define MT_CHECK(cond, ...)                                   \
  do {                                                        \
    if (!(cond)) throw ::mt::Error(::mt::detail::concat(__VA_ARGS__)); \
  } while (0)
