#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

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
// "a, b, c": lists of names in error messages.
inline std::string join(const std::vector<std::string>& items, const std::string& separator = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out.append(i ? separator : "").append(items[i]);
  return out;
}
}  // namespace detail

}  // namespace mt

// MT_CHECK(cond, "[op] ", "message parts", shape) throws mt::Error when cond is false.
#define MT_CHECK(cond, ...)                                   \
  do {                                                        \
    if (!(cond)) throw ::mt::Error(::mt::detail::concat(__VA_ARGS__)); \
  } while (0)
