// The chat template evaluator: statements (scoping as jinja2 does it: a for loop's body gets a
// fresh scope per iteration, if does not open one, macros see their arguments and the
// top-level variables) and expressions with Python's operator semantics.
#include "meshtrain/serve/chat_template/eval.h"

#include <cmath>

#include "meshtrain/core/error.h"

namespace mt::serve::chat_template_detail {

namespace {
// A block's own scope, popped however the block ends (normally, a break, an error).
template <class Scopes>
class ScopeFrame {
 public:
  explicit ScopeFrame(Scopes& scopes) : scopes_(scopes) { scopes_.emplace_back(); }
  ~ScopeFrame() { scopes_.pop_back(); }
  ScopeFrame(const ScopeFrame&) = delete;
  ScopeFrame& operator=(const ScopeFrame&) = delete;

 private:
  Scopes& scopes_;
};
}  // namespace

Interp::Interp(const ProgramTree& tree, const Value& variables) : tree_(tree) {
  scopes_.emplace_back();
  if (variables.kind == Kind::Dict)
    for (const auto& [k, v] : variables.dict->items)
      if (k.kind == Kind::String) scopes_[0][k.s] = v;
  install_globals();
}

std::string Interp::render() {
  std::string out;
  exec_body(tree_.body, out);
  return out;
}

Interp::Flow Interp::exec_body(const Body& body, std::string& out) {
  for (const auto& node : body) {
    const Flow flow = exec(*node, out);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Interp::Flow Interp::exec(const Node& node, std::string& out) {
  switch (node.kind) {
    case NodeKind::Text:
      out += node.text;
      return Flow::Normal;
    case NodeKind::Output:
      out += to_str(eval(*node.expr));
      return Flow::Normal;
    case NodeKind::If:
      for (const auto& [cond, body] : node.branches)
        if (!cond || truthy(eval(*cond))) return exec_body(body, out);
      return Flow::Normal;
    case NodeKind::For:
      return exec_for(node, out);
    case NodeKind::Set: {
      const Value value = eval(*node.expr);
      try {
        assign(node.target, value);
      } catch (const RuntimeFail& f) {
        throw mt::Error(where(node.pos) + f.what());
      }
      return Flow::Normal;
    }
    case NodeKind::SetBlock:
    case NodeKind::FilterBlock: {
      // The block's own sets stay inside it; a break or continue in it acts on the enclosing
      // loop and drops the block (jinja compiles the body inline).
      std::string captured;
      Flow flow;
      {
        ScopeFrame frame(scopes_);
        flow = exec_body(node.body, captured);
      }
      if (flow != Flow::Normal) return flow;
      Value value = Value::string(std::move(captured));
      if (node.filter) value = eval_filter_chain(*node.filter, value);
      if (node.kind == NodeKind::FilterBlock) {
        out += to_str(value);
      } else {
        try {
          assign(node.target, value);
        } catch (const RuntimeFail& f) {
          throw mt::Error(where(node.pos) + f.what());
        }
      }
      return Flow::Normal;
    }
    case NodeKind::Macro: {
      const Node* macro = &node;
      scopes_.back()[node.text] =
          Value::callable("Macro '" + node.text + "'", [macro](Interp& in, const CallArgs& args) { return in.call_macro(*macro, args); });
      return Flow::Normal;
    }
    case NodeKind::Break:
      return Flow::Break;
    case NodeKind::Continue:
      return Flow::Continue;
    case NodeKind::With: {
      List values;  // evaluated in the enclosing scope, then bound in the block's own
      for (const auto& assignment : node.assignments) values.push_back(eval(*assignment.second));
      ScopeFrame frame(scopes_);
      for (size_t k = 0; k < values.size(); ++k) {
        try {
          assign(node.assignments[k].first, values[k]);
        } catch (const RuntimeFail& f) {
          throw mt::Error(where(node.pos) + f.what());
        }
      }
      return exec_body(node.body, out);
    }
  }
  return Flow::Normal;
}

Interp::Flow Interp::exec_for(const Node& node, std::string& out) {
  const Value iterable = eval(*node.expr);
  List items;
  try {
    items = iterate(iterable);
  } catch (const RuntimeFail& f) {
    throw mt::Error(where(node.expr->pos) + f.what());
  }
  if (node.condition) {  // the inline `if` filters before loop.index/length are counted
    List kept;
    for (const Value& item : items) {
      ScopeFrame frame(scopes_);
      try {
        assign(node.target, item);
        if (truthy(eval(*node.condition))) kept.push_back(item);
      } catch (const RuntimeFail& f) {
        throw mt::Error(where(node.pos) + f.what());
      }
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec_body(node.else_body, out);  // a break there ends an enclosing loop
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < length; ++k) {
    Dict loop;
    loop.items.reserve(12);
    auto put = [&](const char* name, Value v) { loop.items.emplace_back(Value::string(name), std::move(v)); };
    put("index", Value::integer(k + 1));
    put("index0", Value::integer(k));
    put("revindex", Value::integer(length - k));
    put("revindex0", Value::integer(length - k - 1));
    put("first", Value::boolean(k == 0));
    put("last", Value::boolean(k == length - 1));
    put("length", Value::integer(length));
    put("depth", Value::integer(1));
    put("depth0", Value::integer(0));
    put("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item"));
    put("nextitem", k + 1 < length ? items[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item"));
    put("cycle", Value::callable("cycle", [k](Interp&, const CallArgs& args) {
          if (args.positional.empty()) throw RuntimeFail("TypeError: no items for cycling given");
          return args.positional[static_cast<size_t>(k) % args.positional.size()];
        }));
    Flow flow;
    {
      ScopeFrame frame(scopes_);
      try {
        assign(node.target, items[static_cast<size_t>(k)]);
        scopes_.back()["loop"] = Value::dict_of(std::move(loop));
        flow = exec_body(node.body, out);
      } catch (const RuntimeFail& f) {
        throw mt::Error(where(node.pos) + f.what());
      }
    }
    if (flow == Flow::Break) break;
  }
  return Flow::Normal;
}

Value Interp::lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    const auto found = it->find(name);
    if (found != it->end()) return found->second;
  }
  const auto global = globals_.find(name);
  if (global != globals_.end()) return global->second;
  return Value::undefined("'" + name + "' is undefined");
}

void Interp::assign(const Target& target, const Value& value) {
  if (!target.attr.empty()) {
    const Value ns = lookup(target.names[0]);
    if (ns.kind != Kind::Namespace)
      throw RuntimeFail("TemplateRuntimeError: cannot assign attribute on non-namespace object");
    ns.ns->set(target.attr, value);
    return;
  }
  if (!target.tuple) {
    scopes_.back()[target.names[0]] = value;
    return;
  }
  const List items = iterate(value);
  if (items.size() != target.names.size())
    throw RuntimeFail(items.size() < target.names.size()
                          ? "ValueError: not enough values to unpack (expected " + std::to_string(target.names.size()) +
                                ", got " + std::to_string(items.size()) + ")"
                          : "ValueError: too many values to unpack (expected " + std::to_string(target.names.size()) + ")");
  for (size_t k = 0; k < items.size(); ++k) scopes_.back()[target.names[k]] = items[k];
}

Value Interp::eval(const Expr& e) {
  try {
    return eval_inner(e);
  } catch (const RuntimeFail& f) {
    throw mt::Error(where(e.pos) + f.what());
  }
}

CallArgs Interp::eval_args(const Expr& e) {
  CallArgs args;
  args.positional.reserve(e.items.size());
  for (const auto& item : e.items) args.positional.push_back(eval(*item));
  for (const auto& [name, expr] : e.kwargs) args.keyword.emplace_back(name, eval(*expr));
  return args;
}

Value Interp::eval_filter_chain(const Expr& filter, const Value& subject) {
  const Value inner = filter.a ? eval_filter_chain(*filter.a, subject) : subject;
  const CallArgs args = eval_args(filter);
  try {
    return apply_filter(filter.name, inner, args);
  } catch (const RuntimeFail& f) {
    throw mt::Error(where(filter.pos) + f.what());
  }
}

static std::optional<int64_t> slice_bound(Interp& in, const ExprPtr& e) {
  if (!e) return std::nullopt;
  const Value v = in.eval(*e);
  if (v.kind == Kind::None) return std::nullopt;
  if (!v.is_integral()) throw RuntimeFail("TypeError: slice indices must be integers or None");
  return v.as_int();
}

Value Interp::eval_inner(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Literal:
      return e.value;
    case ExprKind::Name:
      return lookup(e.name);
    case ExprKind::ListLit:
    case ExprKind::TupleLit: {
      List items;
      items.reserve(e.items.size());
      for (const auto& item : e.items) items.push_back(eval(*item));
      return e.kind == ExprKind::ListLit ? Value::list_of(std::move(items)) : Value::tuple_of(std::move(items));
    }
    case ExprKind::DictLit: {
      Dict d;
      for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
        Value key = eval(*e.items[k]);
        check_hashable(key);
        d.set(std::move(key), eval(*e.items[k + 1]));
      }
      return Value::dict_of(std::move(d));
    }
    case ExprKind::GetAttr:
      return get_attr(eval(*e.a), e.name);
    case ExprKind::GetItem: {
      const Value obj = eval(*e.a);
      if (e.b->kind == ExprKind::Slice) {
        const auto start = slice_bound(*this, e.b->b), stop = slice_bound(*this, e.b->c), step = slice_bound(*this, e.b->d);
        return slice(obj, start, stop, step);
      }
      return get_item(obj, eval(*e.b));
    }
    case ExprKind::Slice:
      throw RuntimeFail("a slice is only valid inside []");
    case ExprKind::Neg:
    case ExprKind::Pos: {
      const Value v = eval(*e.a);
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) throw RuntimeFail("TypeError: bad operand type for unary " + std::string(e.kind == ExprKind::Neg ? "-" : "+") + ": '" + type_name(v) + "'");
      if (v.kind == Kind::Float) return Value::floating(e.kind == ExprKind::Neg ? -v.f : v.f);
      if (e.kind == ExprKind::Neg && v.as_int() == INT64_MIN)
        throw RuntimeFail("OverflowError: integer result outside the 64-bit range this interpreter supports");
      return Value::integer(e.kind == ExprKind::Neg ? -v.as_int() : v.as_int());
    }
    case ExprKind::Not:
      return Value::boolean(!truthy(eval(*e.a)));
    case ExprKind::And: {
      Value left = eval(*e.a);
      return truthy(left) ? eval(*e.b) : left;
    }
    case ExprKind::Or: {
      Value left = eval(*e.a);
      return truthy(left) ? left : eval(*e.b);
    }
    case ExprKind::Binary: {
      const Value left = eval(*e.a);
      const Value right = eval(*e.b);
      return binary_op(e.name, left, right);
    }
    case ExprKind::Compare: {
      Value left = eval(*e.a);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.items[k]);
        const std::string& op = e.ops[k];
        bool ok;
        if (op == "==") ok = equals(left, right);
        else if (op == "!=") ok = !equals(left, right);
        else if (op == "in") ok = contains(right, left);
        else if (op == "notin") ok = !contains(right, left);
        else {
          const int c = compare(left, right, op.c_str());
          ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!ok) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::Cond:
      if (truthy(eval(*e.b))) return eval(*e.a);
      if (e.c) return eval(*e.c);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.pos.line) +
                              " evaluated to false and no else section was defined.");
    case ExprKind::Filter:
      return apply_filter(e.name, e.a ? eval(*e.a) : Value::undefined(), eval_args(e));
    case ExprKind::Test: {
      const bool result = apply_test(e.name, eval(*e.a), eval_args(e));
      return Value::boolean(e.negated ? !result : result);
    }
    case ExprKind::Call: {
      const Value callee = eval(*e.a);
      return call(callee, eval_args(e));
    }
  }
  return Value::undefined();
}

Value Interp::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (callee.kind != Kind::Callable) throw RuntimeFail("TypeError: '" + type_name(callee) + "' object is not callable");
  return callee.fn->fn(*this, args);
}

Value Interp::call_macro(const Node& macro, const CallArgs& args) {
  if (macro_depth_ >= 256) throw RuntimeFail("RecursionError: maximum recursion depth exceeded in macro calls");
  std::vector<Scope> saved(std::make_move_iterator(scopes_.begin() + 1), std::make_move_iterator(scopes_.end()));
  scopes_.resize(1);
  scopes_.emplace_back();
  ++macro_depth_;
  std::string out;
  try {
    for (size_t k = 0; k < macro.params.size(); ++k) {
      const MacroParam& p = macro.params[k];
      if (const Value* v = args.get(k, p.name)) scopes_.back()[p.name] = *v;
      else if (p.default_value) scopes_.back()[p.name] = eval(*p.default_value);
      else scopes_.back()[p.name] = Value::undefined("parameter '" + p.name + "' was not provided");
    }
    List varargs;
    for (size_t k = macro.params.size(); k < args.positional.size(); ++k) varargs.push_back(args.positional[k]);
    Dict kwargs;
    for (const auto& [name, v] : args.keyword) {
      bool is_param = false;
      for (const auto& p : macro.params) is_param = is_param || p.name == name;
      if (!is_param) kwargs.set(Value::string(name), v);
    }
    scopes_.back()["varargs"] = Value::tuple_of(std::move(varargs));
    scopes_.back()["kwargs"] = Value::dict_of(std::move(kwargs));
    exec_body(macro.body, out);
  } catch (...) {
    --macro_depth_;
    scopes_.resize(1);
    for (auto& s : saved) scopes_.push_back(std::move(s));
    throw;
  }
  --macro_depth_;
  scopes_.resize(1);
  for (auto& s : saved) scopes_.push_back(std::move(s));
  return Value::string(std::move(out));
}

}  // namespace mt::serve::chat_template_detail
