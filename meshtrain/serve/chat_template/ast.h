#pragma once
// Internal to the chat template interpreter: the tokens the lexer produces and the syntax tree
// the parser builds from them (lexer.cpp, parser.cpp).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/serve/chat_template/value.h"

namespace mt::serve::chat_template_detail {

struct Pos {
  int line = 1;
  int column = 1;
};

// "[chat_template] line L, column C: "
std::string where(const Pos& pos);

enum class Tok {
  Data,        // template text (raw blocks included)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,  // text: the decoded value
  Int,
  Float,
  Op,  // text: the operator
  Eof,
};

struct Token {
  Tok type = Tok::Eof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  Pos pos;
};

// --- expressions -----------------------------------------------------------------------------
enum class ExprKind {
  Literal,   // value
  Name,      // name
  ListLit,   // items
  TupleLit,  // items
  DictLit,   // items: key, value, key, value, ...
  GetAttr,   // a.name
  GetItem,   // a[b]
  Slice,     // a[b:c:d] (b, c, d may be null)
  Neg,       // -a
  Pos,       // +a
  Not,       // not a
  Binary,    // a op b: + - * / // % ** ~
  And,       // a and b
  Or,        // a or b
  Compare,   // a ops[0] items[0] ops[1] items[1] ... (== != < <= > >= in notin)
  Cond,      // a if b else c (c null: undefined)
  Filter,    // a|name(args): a null for `{% set x | f %}` and `{% filter %}`
  Test,      // a is [not] name(args)
  Call,      // a(args)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::Literal;
  Pos pos;
  Value value;           // Literal
  std::string name;      // Name, GetAttr attribute, Binary operator, Filter/Test name
  ExprPtr a, b, c, d;    // operands (see ExprKind)
  std::vector<ExprPtr> items;                             // literals' items, Compare operands, call args
  std::vector<std::pair<std::string, ExprPtr>> kwargs;    // Call / Filter / Test keyword args
  std::vector<std::string> ops;                           // Compare operators
  bool negated = false;                                   // Test: `is not`
};

// --- statements ------------------------------------------------------------------------------
enum class NodeKind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, FilterBlock, With };

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

// What `set`/`for` assign to: a name, a tuple of names, or `ns.attr`.
struct Target {
  std::vector<std::string> names;
  bool tuple = false;
  std::string attr;  // non-empty: names[0].attr (namespace assignment)
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Node {
  NodeKind kind = NodeKind::Text;
  Pos pos;
  std::string text;                                   // Text; Macro: its name
  ExprPtr expr;                                       // Output, For iterable, Set value, FilterBlock filter
  std::vector<std::pair<ExprPtr, Body>> branches;     // If: conditions (null: else) and bodies
  Target target;                                      // For, Set, SetBlock
  ExprPtr condition;                                  // For: the inline `if`
  ExprPtr filter;                                     // SetBlock: `{% set x | f %}` filters (may be null)
  Body body, else_body;                               // For, SetBlock, Macro, FilterBlock, With
  std::vector<MacroParam> params;                     // Macro
  std::vector<std::pair<Target, ExprPtr>> assignments;  // With
};

struct ProgramTree {
  Body body;
};

// lexer.cpp: the template as tokens (comments dropped, whitespace control and
// trim_blocks/lstrip_blocks applied).
std::vector<Token> lex_template(const std::string& source);

// parser.cpp: the syntax tree; throws mt::Error on syntax errors.
ProgramTree parse_template(const std::vector<Token>& tokens);

// filters.cpp / predicates.cpp: whether a filter / test of that name exists (the parser
// rejects the others, as Jinja does at compile time).
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

}  // namespace mt::serve::chat_template_detail
