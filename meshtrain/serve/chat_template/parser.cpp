// The chat template parser, statements: text, {{ output }}, if/elif/else, for (else, inline
// if, tuple targets), set (value, namespace attribute, block), macro, break/continue, filter
// blocks and with.
#include "meshtrain/serve/chat_template/parser.h"

#include "meshtrain/core/error.h"

namespace mt::serve::chat_template_detail {

std::string Parser::describe(const Token& t) {
  switch (t.type) {
    case Tok::Eof: return "end of template";
    case Tok::VarEnd: return "end of print statement";
    case Tok::BlockEnd: return "end of statement block";
    case Tok::VarBegin: return "begin of print statement";
    case Tok::BlockBegin: return "begin of statement block";
    case Tok::Data: return "template data";
    case Tok::String: return "string literal";
    default: return "'" + t.text + "'";
  }
}

void Parser::fail(const Token& at, const std::string& message) const { throw mt::Error(where(at.pos) + message); }

void Parser::expect_op(const char* op) {
  if (!is_op(op)) fail(cur(), std::string("expected '") + op + "', got " + describe(cur()));
  next();
}

std::string Parser::expect_name() {
  if (cur().type != Tok::Name) fail(cur(), "expected a name, got " + describe(cur()));
  std::string name = cur().text;
  next();
  return name;
}

void Parser::expect_block_end() {
  if (cur().type != Tok::BlockEnd) fail(cur(), "expected end of statement block, got " + describe(cur()));
  next();
}

ProgramTree Parser::parse() {
  ProgramTree tree;
  tree.body = subparse({}, "", Pos{});
  return tree;
}

Body Parser::subparse(const std::vector<std::string>& end_tags, const std::string& block, const Pos& opened) {
  Body body;
  while (true) {
    const Token& t = cur();
    switch (t.type) {
      case Tok::Data: {
        auto node = std::make_unique<Node>();
        node->kind = NodeKind::Text;
        node->pos = t.pos;
        node->text = t.text;
        body.push_back(std::move(node));
        next();
        break;
      }
      case Tok::VarBegin: {
        auto node = std::make_unique<Node>();
        node->kind = NodeKind::Output;
        node->pos = t.pos;
        next();
        node->expr = parse_tuple();
        if (cur().type != Tok::VarEnd) fail(cur(), "expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(std::move(node));
        break;
      }
      case Tok::BlockBegin: {
        next();
        if (cur().type == Tok::Name)
          for (const auto& tag : end_tags)
            if (cur().text == tag) return body;
        body.push_back(parse_statement());
        break;
      }
      case Tok::Eof: {
        if (end_tags.empty()) return body;
        std::string expected;
        for (size_t k = 0; k < end_tags.size(); ++k)
          expected += (k ? (k + 1 == end_tags.size() ? " or '" : ", '") : "'") + end_tags[k] + "'";
        fail(t, "unexpected end of template: the '" + block + "' block opened at line " +
                    std::to_string(opened.line) + " is not closed (expected " + expected + ")");
      }
      default:
        fail(t, "unexpected " + describe(t));
    }
  }
}

NodePtr Parser::parse_statement() {
  const Token t = cur();
  if (t.type != Tok::Name) fail(t, "expected a tag name, got " + describe(t));
  const std::string& tag = t.text;
  const Pos pos = t.pos;
  if (tag == "if") return parse_if(pos);
  if (tag == "for") return parse_for(pos);
  if (tag == "set") return parse_set(pos);
  if (tag == "macro") return parse_macro(pos);
  if (tag == "filter") return parse_filter_block(pos);
  if (tag == "with") return parse_with(pos);
  if (tag == "break" || tag == "continue") {
    if (loop_depth == 0) fail(t, "'" + tag + "' outside of a loop");
    next();
    expect_block_end();
    auto node = std::make_unique<Node>();
    node->kind = tag == "break" ? NodeKind::Break : NodeKind::Continue;
    node->pos = pos;
    return node;
  }
  if (tag.rfind("end", 0) == 0 || tag == "elif" || tag == "else")
    fail(t, "unexpected '" + tag + "' (no open block expects it here)");
  fail(t, "unknown tag '" + tag + "'");
}

NodePtr Parser::parse_if(const Pos& pos) {
  next();  // if
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::If;
  node->pos = pos;
  ExprPtr cond = parse_tuple(false);
  while (true) {
    expect_block_end();
    Body body = subparse({"elif", "else", "endif"}, "if", pos);
    node->branches.emplace_back(std::move(cond), std::move(body));
    const std::string tag = cur().text;
    next();
    if (tag == "elif") {
      cond = parse_tuple(false);
      continue;
    }
    if (tag == "else") {
      expect_block_end();
      node->branches.emplace_back(nullptr, subparse({"endif"}, "if", pos));
      next();
    }
    expect_block_end();
    return node;
  }
}

Target Parser::parse_target(bool with_namespace, const char* end_name) {
  Target target;
  if (with_namespace && cur().type == Tok::Name && look(1).type == Tok::Op && look(1).text == "." &&
      look(2).type == Tok::Name) {
    target.names.push_back(cur().text);
    next();
    next();
    target.attr = cur().text;
    next();
    return target;
  }
  const bool parenthesized = skip_op("(");
  while (true) {
    target.names.push_back(expect_name());
    if (!is_op(",")) break;
    target.tuple = true;
    next();
    if ((end_name && is_name(end_name)) || is_op("=") || is_op(")") || cur().type == Tok::BlockEnd) break;
  }
  if (parenthesized) {
    target.tuple = true;
    expect_op(")");
  }
  return target;
}

NodePtr Parser::parse_for(const Pos& pos) {
  next();  // for
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::For;
  node->pos = pos;
  node->target = parse_target(false, "in");
  if (!skip_name("in")) fail(cur(), "expected 'in', got " + describe(cur()));
  node->expr = parse_tuple(false, "recursive");
  if (skip_name("if")) node->condition = parse_expression();
  if (is_name("recursive")) fail(cur(), "recursive loops are not supported");
  expect_block_end();
  ++loop_depth;
  node->body = subparse({"endfor", "else"}, "for", pos);
  --loop_depth;
  if (cur().text == "else") {
    next();
    expect_block_end();
    node->else_body = subparse({"endfor"}, "for", pos);
  }
  next();  // endfor
  expect_block_end();
  return node;
}

NodePtr Parser::parse_set(const Pos& pos) {
  next();  // set
  auto node = std::make_unique<Node>();
  node->pos = pos;
  node->target = parse_target(true, nullptr);
  if (skip_op("=")) {
    node->kind = NodeKind::Set;
    node->expr = parse_tuple();
    expect_block_end();
    return node;
  }
  node->kind = NodeKind::SetBlock;
  if (is_op("|")) node->filter = parse_filter(nullptr);
  expect_block_end();
  const int saved_depth = loop_depth;
  node->body = subparse({"endset"}, "set", pos);
  loop_depth = saved_depth;
  next();  // endset
  expect_block_end();
  return node;
}

NodePtr Parser::parse_macro(const Pos& pos) {
  next();  // macro
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::Macro;
  node->pos = pos;
  node->text = expect_name();
  expect_op("(");
  while (!is_op(")")) {
    if (!node->params.empty()) expect_op(",");
    if (is_op(")")) break;
    MacroParam param;
    param.name = expect_name();
    if (skip_op("=")) param.default_value = parse_expression();
    else if (!node->params.empty() && node->params.back().default_value)
      fail(cur(), "non-default argument follows default argument");
    node->params.push_back(std::move(param));
  }
  expect_op(")");
  expect_block_end();
  const int saved_depth = loop_depth;
  loop_depth = 0;
  node->body = subparse({"endmacro"}, "macro", pos);
  loop_depth = saved_depth;
  next();  // endmacro
  expect_block_end();
  return node;
}

NodePtr Parser::parse_filter_block(const Pos& pos) {
  next();  // filter
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::FilterBlock;
  node->pos = pos;
  node->filter = parse_filter(nullptr, true);
  expect_block_end();
  node->body = subparse({"endfilter"}, "filter", pos);
  next();
  expect_block_end();
  return node;
}

NodePtr Parser::parse_with(const Pos& pos) {
  next();  // with
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::With;
  node->pos = pos;
  while (cur().type != Tok::BlockEnd) {
    if (!node->assignments.empty()) expect_op(",");
    Target target = parse_target(false, nullptr);
    expect_op("=");
    node->assignments.emplace_back(std::move(target), parse_expression());
  }
  expect_block_end();
  node->body = subparse({"endwith"}, "with", pos);
  next();
  expect_block_end();
  return node;
}

ProgramTree parse_template(const std::vector<Token>& tokens) { return Parser(tokens).parse(); }

}  // namespace mt::serve::chat_template_detail
