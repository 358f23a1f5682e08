#include "meshtrain/io/pickle.h"

#include <cstring>

#include "meshtrain/core/error.h"

namespace mt::io {
namespace {

using Kind = PickleValue::Kind;

PickleRef make(Kind k) {
  auto v = std::make_shared<PickleValue>();
  v->kind = k;
  return v;
}
PickleRef make_int(int64_t i) {
  auto v = make(Kind::integer);
  v->integer = i;
  return v;
}
PickleRef make_text(Kind k, std::string s) {
  auto v = make(k);
  v->text = std::move(s);
  return v;
}

// The callable globals; storage classes are accepted as dtype names only.
bool callable_global(const std::string& name) {
  return name == "collections.OrderedDict" || name == "torch._utils._rebuild_tensor_v2" ||
         name == "torch._utils._rebuild_tensor" || name == "torch._utils._rebuild_parameter";
}

class Machine {
 public:
  Machine(std::string_view bytes, const std::string& where, const std::function<PickleRef(const PickleRef&)>& pl)
      : b_(bytes), where_(where), persistent_load_(pl) {}

  PickleRef run(size_t* consumed) {
    while (true) {
      const size_t at = pos_;
      const uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;             // PROTO
        case 0x95: take(8); break;          // FRAME (a length hint)
        case '.': {                         // STOP
          if (consumed) *consumed = pos_;
          return pop(at);
        }
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case ')': push(make(Kind::tuple)); break;          // EMPTY_TUPLE
        case ']': push(make(Kind::list)); break;           // EMPTY_LIST
        case '}': push(make(Kind::dict)); break;           // EMPTY_DICT
        case 'N': push(make(Kind::none)); break;
        case 0x88: case 0x89: {  // NEWTRUE, NEWFALSE
          auto v = make(Kind::boolean);
          v->boolean = op == 0x88;
          push(v);
          break;
        }
        case 'J': push(make_int(int32_t(le<uint32_t>(4)))); break;  // BININT
        case 'K': push(make_int(u8())); break;                      // BININT1
        case 'M': push(make_int(le<uint16_t>(2))); break;           // BININT2
        case 0x8a: push(make_int(long_int(u8(), at))); break;        // LONG1
        case 0x8b: push(make_int(long_int(le<uint32_t>(4), at))); break;  // LONG4
        case 'G': {  // BINFLOAT: big-endian double
          uint64_t bits = 0;
          for (char c : take(8)) bits = bits << 8 | uint8_t(c);
          auto v = make(Kind::floating);
          std::memcpy(&v->floating, &bits, 8);
          push(v);
          break;
        }
        case 'X': push(make_text(Kind::string, std::string(take(le<uint32_t>(4))))); break;   // BINUNICODE
        case 0x8c: push(make_text(Kind::string, std::string(take(u8())))); break;            // SHORT_BINUNICODE
        case 0x8d: push(make_text(Kind::string, std::string(take(le<uint64_t>(8))))); break;  // BINUNICODE8
        case 'T': push(make_text(Kind::string, std::string(take(le<uint32_t>(4))))); break;   // BINSTRING
        case 'U': push(make_text(Kind::string, std::string(take(u8())))); break;             // SHORT_BINSTRING
        case 'B': push(make_text(Kind::bytes, std::string(take(le<uint32_t>(4))))); break;    // BINBYTES
        case 'C': push(make_text(Kind::bytes, std::string(take(u8())))); break;              // SHORT_BINBYTES
        case 't': {  // TUPLE
          auto v = make(Kind::tuple);
          v->items = pop_mark(at);
          push(v);
          break;
        }
        case 'l': {  // LIST
          auto v = make(Kind::list);
          v->items = pop_mark(at);
          push(v);
          break;
        }
        case 'd': {  // DICT
          auto v = make(Kind::dict);
          auto items = pop_mark(at);
          for (size_t i = 0; i + 1 < items.size(); i += 2) v->entries.emplace_back(items[i], items[i + 1]);
          push(v);
          break;
        }
        case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
          auto v = make(Kind::tuple);
          v->items.resize(size_t(op - 0x84));
          for (size_t i = v->items.size(); i-- > 0;) v->items[i] = pop(at);
          push(v);
          break;
        }
        case 'q': memo(u8(), at); break;              // BINPUT
        case 'r': memo(le<uint32_t>(4), at); break;   // LONG_BINPUT
        case 0x94: memo(memo_.size(), at); break;     // MEMOIZE
        case 'h': push(recall(u8(), at)); break;      // BINGET
        case 'j': push(recall(le<uint32_t>(4), at)); break;  // LONG_BINGET
        case '0': pop(at); break;                     // POP
        case '1': pop_mark(at); break;                // POP_MARK
        case '2': push(top(at)); break;               // DUP
        case 's': {  // SETITEM
          auto value = pop(at), key = pop(at);
          container(Kind::dict, at)->entries.emplace_back(key, value);
          break;
        }
        case 'u': {  // SETITEMS
          auto items = pop_mark(at);
          auto d = container(Kind::dict, at);
          for (size_t i = 0; i + 1 < items.size(); i += 2) d->entries.emplace_back(items[i], items[i + 1]);
          break;
        }
        case 'a': {  // APPEND
          auto value = pop(at);
          container(Kind::list, at)->items.push_back(value);
          break;
        }
        case 'e': {  // APPENDS
          auto items = pop_mark(at);
          auto l = container(Kind::list, at);
          l->items.insert(l->items.end(), items.begin(), items.end());
          break;
        }
        case 'c': {  // GLOBAL "module\nname\n"
          std::string module = line(at), name = line(at);
          push(global(module + "." + name, at));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          auto name = pop(at), module = pop(at);
          if (name->kind != Kind::string || module->kind != Kind::string) fail(at, "STACK_GLOBAL of non-strings");
          push(global(module->text + "." + name->text, at));
          break;
        }
        case 'Q': {  // BINPERSID
          auto pid = pop(at);
          if (!persistent_load_) fail(at, "a persistent id where none is expected");
          push(persistent_load_(pid));
          break;
        }
        case 'R': {  // REDUCE
          auto args = pop(at), fn = pop(at);
          push(call(fn, args, at));
          break;
        }
        case 0x81: {  // NEWOBJ
          auto args = pop(at), cls = pop(at);
          push(call(cls, args, at));
          break;
        }
        case 'b': pop(at); break;  // BUILD: object state (OrderedDict's _metadata): not needed
        default:
          fail(at, detail::concat("unsupported pickle opcode 0x", hex(op),
                                  " (not something torch.save writes for a state dict)"));
      }
    }
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw Error(detail::concat("[pickle] ", where_, ": byte ", at, ": ", what));
  }
  static std::string hex(uint8_t v) {
    const char* d = "0123456789abcdef";
    return std::string{d[v >> 4], d[v & 15]};
  }
  uint8_t u8() {
    if (pos_ >= b_.size()) fail(pos_, "unexpected end of data (truncated pickle)");
    return uint8_t(b_[pos_++]);
  }
  std::string_view take(uint64_t n) {
    if (n > b_.size() - pos_) fail(pos_, detail::concat("a ", n, "-byte field runs past the end (truncated pickle)"));
    auto s = b_.substr(pos_, size_t(n));
    pos_ += size_t(n);
    return s;
  }
  template <class T>
  T le(size_t n) {
    T v = 0;
    std::memcpy(&v, take(n).data(), n);
    return v;
  }
  int64_t long_int(uint64_t n, size_t at) {
    if (n > 8) fail(at, detail::concat("an integer of ", n, " bytes does not fit 64 bits"));
    auto s = take(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t(uint8_t(s[i])) << (8 * i);
    if (n > 0 && n < 8 && (uint8_t(s[n - 1]) & 0x80)) v |= ~uint64_t(0) << (8 * n);  // sign-extend
    return int64_t(v);
  }
  std::string line(size_t at) {
    const size_t end = b_.find('\n', pos_);
    if (end == std::string_view::npos) fail(at, "GLOBAL without a newline");
    std::string s(b_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  void push(PickleRef v) { stack_.push_back(std::move(v)); }
  PickleRef pop(size_t at) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail(at, "stack underflow");
    auto v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  const PickleRef& top(size_t at) {
    if (stack_.empty()) fail(at, "stack underflow");
    return stack_.back();
  }
  std::vector<PickleRef> pop_mark(size_t at) {
    if (marks_.empty()) fail(at, "no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PickleRef> items(stack_.begin() + long(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  PickleRef container(Kind k, size_t at) {
    const PickleRef& c = top(at);
    if (c->kind != k) fail(at, detail::concat("adding items to a ", c->describe()));
    return c;
  }
  void memo(uint64_t i, size_t at) {
    if (i > (1u << 26)) fail(at, "memo index out of range");
    if (memo_.size() <= i) memo_.resize(size_t(i) + 1);
    memo_[size_t(i)] = top(at);
  }
  PickleRef recall(uint64_t i, size_t at) {
    if (i >= memo_.size() || !memo_[size_t(i)]) fail(at, detail::concat("memo entry ", i, " is unset"));
    return memo_[size_t(i)];
  }
  PickleRef global(const std::string& name, size_t at) {
    if (!callable_global(name) && torch_storage_dtype(name).empty())
      fail(at, detail::concat("refuses global '", name,
                              "': a checkpoint may only rebuild tensors (this file would run code when loaded by "
                              "torch.load; it is not loaded)"));
    return make_text(Kind::global, name);
  }
  static const PickleRef& arg(const PickleRef& args, size_t i) { return args->items[i]; }
  std::vector<int64_t> int_tuple(const PickleRef& v, const char* what, size_t at) {
    std::vector<int64_t> out;
    if (v->kind != Kind::tuple && v->kind != Kind::list) fail(at, detail::concat(what, " is a ", v->describe()));
    for (const auto& x : v->items) {
      if (x->kind != Kind::integer) fail(at, detail::concat(what, " holds a ", x->describe()));
      out.push_back(x->integer);
    }
    return out;
  }
  PickleRef call(const PickleRef& fn, const PickleRef& args, size_t at) {
    if (fn->kind != Kind::global || !callable_global(fn->text))
      fail(at, detail::concat("calls a ", fn->describe(), ", which is not a tensor rebuild"));
    if (args->kind != Kind::tuple) fail(at, detail::concat("arguments of ", fn->text, " are a ", args->describe()));
    const std::string& f = fn->text;
    const size_t n = args->items.size();
    if (f == "collections.OrderedDict") return make(Kind::dict);
    if (f == "torch._utils._rebuild_parameter") {
      if (n < 1 || arg(args, 0)->kind != Kind::tensor) fail(at, "_rebuild_parameter without a tensor");
      return arg(args, 0);
    }
    // _rebuild_tensor(_v2)(storage, storage_offset, size, stride, ...)
    if (n < 4 || arg(args, 0)->kind != Kind::storage || arg(args, 1)->kind != Kind::integer)
      fail(at, detail::concat(f, " with unexpected arguments"));
    auto t = make(Kind::tensor);
    t->storage = arg(args, 0);
    t->offset = arg(args, 1)->integer;
    t->shape = int_tuple(arg(args, 2), "a tensor's size", at);
    t->stride = int_tuple(arg(args, 3), "a tensor's stride", at);
    if (t->shape.size() != t->stride.size()) fail(at, "a tensor's size and stride differ in length");
    return t;
  }

  std::string_view b_;
  const std::string& where_;
  const std::function<PickleRef(const PickleRef&)>& persistent_load_;
  size_t pos_ = 0;
  std::vector<PickleRef> stack_, memo_;
  std::vector<size_t> marks_;
};

}  // namespace

std::string PickleValue::describe() const {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "string";
    case Kind::bytes: return "bytes";
    case Kind::tuple: return detail::concat("tuple of ", items.size());
    case Kind::list: return detail::concat("list of ", items.size());
    case Kind::dict: return detail::concat("dict of ", entries.size());
    case Kind::global: return "global '" + text + "'";
    case Kind::storage: return "storage";
    case Kind::tensor: return "tensor";
  }
  return "value";
}

std::string torch_storage_dtype(const std::string& name) {
  static const std::pair<const char*, const char*> kTypes[] = {
      {"torch.FloatStorage", "F32"}, {"torch.HalfStorage", "F16"},  {"torch.BFloat16Storage", "BF16"},
      {"torch.DoubleStorage", "F64"}, {"torch.LongStorage", "I64"}, {"torch.IntStorage", "I32"},
      {"torch.ShortStorage", "I16"}, {"torch.CharStorage", "I8"},   {"torch.ByteStorage", "U8"},
      {"torch.BoolStorage", "BOOL"}};
  for (const auto& [k, v] : kTypes)
    if (name == k) return v;
  return "";
}

PickleRef unpickle(std::string_view bytes, const std::string& where,
                   const std::function<PickleRef(const PickleRef&)>& persistent_load, size_t* consumed) {
  return Machine(bytes, where, persistent_load).run(consumed);
}

}  // namespace mt::io
