// The elementwise op tables both backends share: names for errors, traces and the registry,
// and the dtype rules, generated from MT_UNARY_OPS / MT_BINARY_OPS.
#include "meshtrain/backend/elementwise.h"

namespace mt::kernels {

const char* unary_name(UnaryOp op) {
#define MT_NAME(e, name, ...) name,
  static const char* names[] = {MT_UNARY_OPS(MT_NAME)};
  return names[int(op)];
}
const char* binary_name(BinaryOp op) {
  static const char* names[] = {MT_BINARY_OPS(MT_NAME)};
#undef MT_NAME
  return names[int(op)];
}
bool unary_accepts_integers(UnaryOp op) {
#define MT_INTEGER_OK(e, name, integer_ok) integer_ok,
  static const bool ok[] = {MT_UNARY_OPS(MT_INTEGER_OK)};
#undef MT_INTEGER_OK
  return ok[int(op)];
}
bool is_comparison(BinaryOp op) { return op >= BinaryOp::eq; }

}  // namespace mt::kernels
