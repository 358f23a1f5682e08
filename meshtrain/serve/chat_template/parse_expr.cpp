// The chat template parser, expressions: jinja2's grammar, lowest precedence first:
// `x if c else y`, or, and, not, comparisons (== != < <= > >= in, not in), + -, ~, * / // %,
// **, unary - +, then primaries with their postfixes (.attr [index] [slice] (call)), filters
// (|f(args)) and tests (is [not] t args).
#include "meshtrain/core/error.h"
#include "meshtrain/serve/chat_template/parser.h"

namespace mt::serve::chat_template_detail {

ExprPtr make_expr(ExprKind kind, const Pos& pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

namespace {
ExprPtr binary(ExprKind kind, const std::string& op, ExprPtr left, ExprPtr right, const Pos& pos) {
  auto e = make_expr(kind, pos);
  e->name = op;
  e->a = std::move(left);
  e->b = std::move(right);
  return e;
}
}  // namespace

ExprPtr Parser::parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

ExprPtr Parser::parse_tuple(bool with_condexpr, const char* extra_end, bool explicit_parentheses) {
  const Pos pos = cur().pos;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  auto at_end = [&] {
    return cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")") || (extra_end && is_name(extra_end));
  };
  while (true) {
    if (!items.empty()) expect_op(",");
    if (at_end()) break;
    items.push_back(parse_expression(with_condexpr));
    if (is_op(",")) is_tuple = true;
    else break;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parentheses) fail(cur(), "expected an expression, got " + describe(cur()));
  }
  auto e = make_expr(ExprKind::TupleLit, pos);
  e->items = std::move(items);
  return e;
}

ExprPtr Parser::parse_condexpr() {
  ExprPtr expr = parse_or();
  while (is_name("if")) {
    const Pos pos = cur().pos;
    next();
    auto cond = make_expr(ExprKind::Cond, pos);
    cond->b = parse_or();
    if (skip_name("else")) cond->c = parse_condexpr();
    cond->a = std::move(expr);
    expr = std::move(cond);
  }
  return expr;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    const Pos pos = cur().pos;
    next();
    left = binary(ExprKind::Or, "or", std::move(left), parse_and(), pos);
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    const Pos pos = cur().pos;
    next();
    left = binary(ExprKind::And, "and", std::move(left), parse_not(), pos);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    auto e = make_expr(ExprKind::Not, cur().pos);
    next();
    e->a = parse_not();
    return e;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const Pos pos = cur().pos;
  ExprPtr expr = parse_math1();
  std::vector<std::string> ops;
  std::vector<ExprPtr> operands;
  while (true) {
    if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                                  cur().text == ">" || cur().text == ">=")) {
      ops.push_back(cur().text);
      next();
    } else if (is_name("in")) {
      ops.push_back("in");
      next();
    } else if (is_name("not") && look(1).type == Tok::Name && look(1).text == "in") {
      ops.push_back("notin");
      next();
      next();
    } else {
      break;
    }
    operands.push_back(parse_math1());
  }
  if (ops.empty()) return expr;
  auto e = make_expr(ExprKind::Compare, pos);
  e->a = std::move(expr);
  e->ops = std::move(ops);
  e->items = std::move(operands);
  return e;
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token op = cur();
    next();
    left = binary(ExprKind::Binary, op.text, std::move(left), parse_concat(), op.pos);
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (is_op("~")) {
    const Pos pos = cur().pos;
    next();
    left = binary(ExprKind::Binary, "~", std::move(left), parse_math2(), pos);
  }
  return left;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token op = cur();
    next();
    left = binary(ExprKind::Binary, op.text, std::move(left), parse_pow(), op.pos);
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary();
  while (is_op("**")) {
    const Pos pos = cur().pos;
    next();
    left = binary(ExprKind::Binary, "**", std::move(left), parse_unary(), pos);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    node = make_expr(is_op("-") ? ExprKind::Neg : ExprKind::Pos, cur().pos);
    next();
    node->a = parse_unary(false);
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  ExprPtr node;
  switch (t.type) {
    case Tok::Name: {
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
        node = make_expr(ExprKind::Literal, t.pos);
        node->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
      } else if (t.text == "none" || t.text == "None") {
        node = make_expr(ExprKind::Literal, t.pos);
        node->value = Value::none();
      } else {
        node = make_expr(ExprKind::Name, t.pos);
        node->name = t.text;
      }
      next();
      return node;
    }
    case Tok::String: {
      node = make_expr(ExprKind::Literal, t.pos);
      std::string text;
      while (cur().type == Tok::String) {  // adjacent literals concatenate
        text += cur().text;
        next();
      }
      node->value = Value::string(std::move(text));
      return node;
    }
    case Tok::Int:
    case Tok::Float:
      node = make_expr(ExprKind::Literal, t.pos);
      node->value = t.type == Tok::Int ? Value::integer(t.int_value) : Value::floating(t.float_value);
      next();
      return node;
    case Tok::Op:
      if (t.text == "(") {
        next();
        node = parse_tuple(true, nullptr, true);
        expect_op(")");
        return node;
      }
      if (t.text == "[") {
        node = make_expr(ExprKind::ListLit, t.pos);
        next();
        while (!is_op("]")) {
          if (!node->items.empty()) expect_op(",");
          if (is_op("]")) break;
          node->items.push_back(parse_expression());
        }
        expect_op("]");
        return node;
      }
      if (t.text == "{") {
        node = make_expr(ExprKind::DictLit, t.pos);
        next();
        while (!is_op("}")) {
          if (!node->items.empty()) expect_op(",");
          if (is_op("}")) break;
          node->items.push_back(parse_expression());
          expect_op(":");
          node->items.push_back(parse_expression());
        }
        expect_op("}");
        return node;
      }
      break;
    default:
      break;
  }
  fail(t, "unexpected " + describe(t));
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("[")) node = parse_subscript(std::move(node));
    else if (is_op("(")) node = parse_call(std::move(node));
    else return node;
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) node = parse_filter(std::move(node));
    else if (is_name("is")) node = parse_test(std::move(node));
    else if (is_op("(")) node = parse_call(std::move(node));
    else return node;
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  const Token t = cur();
  next();
  if (t.text == ".") {
    const Token attr = cur();
    if (attr.type == Tok::Name) {
      next();
      auto e = make_expr(ExprKind::GetAttr, t.pos);
      e->a = std::move(node);
      e->name = attr.text;
      return e;
    }
    if (attr.type == Tok::Int) {
      next();
      auto e = make_expr(ExprKind::GetItem, t.pos);
      e->a = std::move(node);
      e->b = make_expr(ExprKind::Literal, attr.pos);
      e->b->value = Value::integer(attr.int_value);
      return e;
    }
    fail(attr, "expected a name or number after '.', got " + describe(attr));
  }
  std::vector<ExprPtr> args;
  while (!is_op("]")) {
    if (!args.empty()) {
      expect_op(",");
      if (is_op("]")) break;
    }
    args.push_back(parse_subscribed());
  }
  expect_op("]");
  auto e = make_expr(ExprKind::GetItem, t.pos);
  e->a = std::move(node);
  if (args.size() == 1) {
    e->b = std::move(args[0]);
  } else {
    e->b = make_expr(ExprKind::TupleLit, t.pos);
    e->b->items = std::move(args);
  }
  return e;
}

ExprPtr Parser::parse_subscribed() {
  const Pos pos = cur().pos;
  auto slice = make_expr(ExprKind::Slice, pos);
  if (!is_op(":")) {
    ExprPtr start = parse_expression();
    if (!is_op(":")) return start;
    slice->b = std::move(start);
  }
  next();  // ':'
  if (!is_op(":") && !is_op("]") && !is_op(",")) slice->c = parse_expression();
  if (skip_op(":"))
    if (!is_op("]") && !is_op(",")) slice->d = parse_expression();
  return slice;
}

void Parser::parse_call_args(Expr& into) {
  expect_op("(");
  bool first = true;
  while (!is_op(")")) {
    if (!first) {
      expect_op(",");
      if (is_op(")")) break;
    }
    first = false;
    if (is_op("*") || is_op("**")) fail(cur(), "*args and **kwargs in calls are not supported");
    if (cur().type == Tok::Name && look(1).type == Tok::Op && look(1).text == "=") {
      const std::string key = cur().text;
      next();
      next();
      into.kwargs.emplace_back(key, parse_expression());
    } else {
      if (!into.kwargs.empty()) fail(cur(), "positional argument after keyword argument");
      into.items.push_back(parse_expression());
    }
  }
  expect_op(")");
}

ExprPtr Parser::parse_call(ExprPtr node) {
  auto e = make_expr(ExprKind::Call, cur().pos);
  e->a = std::move(node);
  parse_call_args(*e);
  return e;
}

ExprPtr Parser::parse_filter(ExprPtr node, bool start_inline) {
  while (is_op("|") || start_inline) {
    if (!start_inline) next();
    start_inline = false;
    const Token t = cur();
    std::string name = expect_name();
    while (skip_op(".")) name.append(".").append(expect_name());
    if (!has_filter(name)) fail(t, "no filter named '" + name + "'");
    auto e = make_expr(ExprKind::Filter, t.pos);
    e->a = std::move(node);
    e->name = name;
    if (is_op("(")) parse_call_args(*e);
    node = std::move(e);
  }
  return node;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  next();  // 'is'
  const bool negated = skip_name("not");
  const Token t = cur();
  std::string name = expect_name();
  while (skip_op(".")) name.append(".").append(expect_name());
  if (!has_test(name)) fail(t, "no test named '" + name + "'");
  auto e = make_expr(ExprKind::Test, t.pos);
  e->a = std::move(node);
  e->name = name;
  e->negated = negated;
  const Token& c = cur();
  if (is_op("(")) {
    parse_call_args(*e);
  } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int || c.type == Tok::Float ||
              is_op("[") || is_op("{")) &&
             !(c.type == Tok::Name && (c.text == "else" || c.text == "or" || c.text == "and"))) {
    if (is_name("is")) fail(c, "you cannot chain multiple tests with is");
    e->items.push_back(parse_postfix(parse_primary()));
  }
  return e;
}

}  // namespace mt::serve::chat_template_detail
