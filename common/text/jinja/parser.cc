#include "common/text/jinja/parser.h"

#include <algorithm>
#include <initializer_list>

#include "common/text/jinja/lexer.h"

namespace tandem::jinja {
namespace {

// Tags jinja2 knows that chat templates do not need: named in the error.
bool IsUnsupportedTag(const std::string& name) {
  for (const char* tag : {"include", "extends", "block", "import", "from", "autoescape", "break",
                          "continue", "do", "trans", "pluralize"}) {
    if (name == tag) return true;
  }
  return false;
}

std::string Describe(const Token& t) {
  switch (t.type) {
    case TokenType::kData: return "template data";
    case TokenType::kVarBegin: return "'{{'";
    case TokenType::kVarEnd: return "end of print statement '}}'";
    case TokenType::kBlockBegin: return "'{%'";
    case TokenType::kBlockEnd: return "end of statement block '%}'";
    case TokenType::kName: return "'" + t.text + "'";
    case TokenType::kString: return "string";
    case TokenType::kInt: return "integer";
    case TokenType::kFloat: return "float";
    case TokenType::kOperator: return "'" + t.text + "'";
    case TokenType::kEof: return "end of template";
  }
  return "token";
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body ParseAll() {
    std::vector<std::string> no_end;
    Body body = Subparse(no_end, "", 0);
    if (Cur().type != TokenType::kEof) Throw("unexpected " + Describe(Cur()));
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p(p) {
      if (++p->depth_ > kMaxParseDepth) {
        p->Throw("the template nests deeper than " + std::to_string(kMaxParseDepth) + " levels");
      }
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  [[noreturn]] void Throw(const std::string& message) const {
    throw Error(Error::Kind::kRuntime, message, Cur().line);
  }

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(const char* op) const { return Cur().type == TokenType::kOperator && Cur().text == op; }
  bool IsName(const char* name) const { return Cur().type == TokenType::kName && Cur().text == name; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Throw(std::string("expected '") + op + "', got " + Describe(Cur()));
  }
  std::string ExpectName() {
    if (Cur().type != TokenType::kName) Throw("expected a name, got " + Describe(Cur()));
    std::string name = Cur().text;
    Next();
    return name;
  }
  void ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) {
      Throw("expected end of statement block '%}', got " + Describe(Cur()));
    }
    Next();
  }

  ExprPtr Make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Sets e's height from its children; a tree taller than kMaxParseDepth is refused (the
  // interpreter and the destructors recurse on it).
  ExprPtr Check(ExprPtr e) {
    int h = 0;
    for (const ExprPtr& a : e->args) if (a) h = std::max(h, a->height);
    for (const auto& kw : e->kwargs) h = std::max(h, kw.second->height);
    if (e->star) h = std::max(h, e->star->height);
    if (e->starstar) h = std::max(h, e->starstar->height);
    e->height = h + 1;
    if (e->height > kMaxParseDepth) {
      Throw("the expression nests deeper than " + std::to_string(kMaxParseDepth) + " levels");
    }
    return e;
  }

  // Statements until a block tag named in `end_tags` (left unconsumed, after its '{%'), or EOF
  // when end_tags is empty.
  Body Subparse(const std::vector<std::string>& end_tags, const std::string& opener, int open_line) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = Cur();
      if (t.type == TokenType::kEof) {
        if (!end_tags.empty()) {
          std::string wanted;
          for (size_t i = 0; i < end_tags.size(); ++i) {
            wanted += (i == 0 ? "'" : i + 1 == end_tags.size() ? " or '" : ", '") + end_tags[i] + "'";
          }
          Throw("unexpected end of template: the '" + opener + "' block opened on line " +
                std::to_string(open_line) + " needs " + wanted);
        }
        return body;
      }
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        Next();
      } else if (t.type == TokenType::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = t.line;
        Next();
        s->expr = ParseTuple(true, {}, false);
        if (Cur().type != TokenType::kVarEnd) {
          Throw("expected end of print statement '}}', got " + Describe(Cur()));
        }
        Next();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        Next();
        if (Cur().type != TokenType::kName) Throw("expected a tag name, got " + Describe(Cur()));
        for (const std::string& end : end_tags) {
          if (Cur().text == end) return body;
        }
        body.push_back(ParseStatement());
      } else {
        Throw("unexpected " + Describe(t));
      }
    }
  }

  StmtPtr ParseStatement() {
    const std::string tag = Cur().text;
    const int line = Cur().line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    Next();
    if (tag == "if") {
      s->kind = StmtKind::kIf;
      s->conds.push_back(ParseTuple(false, {}, false));
      ExpectBlockEnd();
      while (true) {
        s->bodies.push_back(Subparse({"elif", "else", "endif"}, "if", line));
        const std::string end = Cur().text;
        Next();
        if (end == "elif") {
          s->conds.push_back(ParseTuple(false, {}, false));
          ExpectBlockEnd();
        } else if (end == "else") {
          ExpectBlockEnd();
          s->else_body = Subparse({"endif"}, "if", line);
          Next();
          ExpectBlockEnd();
          break;
        } else {
          ExpectBlockEnd();
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = StmtKind::kFor;
      ParseAssignTarget(s.get(), /*namespace_ok=*/false);
      if (!SkipName("in")) Throw("expected 'in', got " + Describe(Cur()));
      s->expr = ParseTuple(false, {"recursive"}, false);
      if (SkipName("if")) s->cond = ParseExpression(true);
      if (SkipName("recursive")) Throw("recursive for loops are not supported");
      ExpectBlockEnd();
      s->body = Subparse({"endfor", "else"}, "for", line);
      const std::string end = Cur().text;
      Next();
      ExpectBlockEnd();
      if (end == "else") {
        s->else_body = Subparse({"endfor"}, "for", line);
        Next();
        ExpectBlockEnd();
      }
    } else if (tag == "set") {
      ParseAssignTarget(s.get(), /*namespace_ok=*/true);
      if (SkipOp("=")) {
        s->kind = StmtKind::kSet;
        s->expr = ParseTuple(true, {}, false);
        ExpectBlockEnd();
      } else {
        s->kind = StmtKind::kSetBlock;
        if (s->unpack || s->targets.size() != 1) Throw("a block set assigns one name");
        if (IsOp("|")) s->filter = ParseFilterChain(nullptr);
        ExpectBlockEnd();
        s->body = Subparse({"endset"}, "set", line);
        Next();
        ExpectBlockEnd();
      }
    } else if (tag == "macro") {
      s->kind = StmtKind::kMacro;
      s->name = ExpectName();
      ParseParams(s.get());
      ExpectBlockEnd();
      s->body = Subparse({"endmacro"}, "macro", line);
      Next();
      if (Cur().type == TokenType::kName) Next();  // {% endmacro name %}
      ExpectBlockEnd();
    } else if (tag == "call") {
      s->kind = StmtKind::kCallBlock;
      if (IsOp("(")) ParseParams(s.get());
      s->expr = ParseExpression(true);
      if (s->expr->kind != ExprKind::kCall) Throw("expected a call after 'call'");
      ExpectBlockEnd();
      s->body = Subparse({"endcall"}, "call", line);
      Next();
      ExpectBlockEnd();
    } else if (tag == "filter") {
      s->kind = StmtKind::kFilterBlock;
      s->filter = ParseFilterChain(nullptr, /*leading_pipe=*/false);
      ExpectBlockEnd();
      s->body = Subparse({"endfilter"}, "filter", line);
      Next();
      ExpectBlockEnd();
    } else if (tag == "with") {
      s->kind = StmtKind::kWith;
      while (Cur().type != TokenType::kBlockEnd) {
        if (!s->assigns.empty()) ExpectOp(",");
        std::string name = ExpectName();
        ExpectOp("=");
        s->assigns.emplace_back(std::move(name), ParseExpression(true));
      }
      ExpectBlockEnd();
      s->body = Subparse({"endwith"}, "with", line);
      Next();
      ExpectBlockEnd();
    } else if (tag == "generation") {
      s->kind = StmtKind::kGeneration;
      ExpectBlockEnd();
      s->body = Subparse({"endgeneration"}, "generation", line);
      Next();
      ExpectBlockEnd();
    } else if (IsUnsupportedTag(tag)) {
      throw Error(Error::Kind::kRuntime, "the '" + tag + "' tag is not supported", line);
    } else {
      throw Error(Error::Kind::kRuntime, "encountered unknown tag '" + tag + "'", line);
    }
    return s;
  }

  // name | name, name | (name, ...) | ns.attr (set only).
  void ParseAssignTarget(Stmt* s, bool namespace_ok) {
    if (namespace_ok && Cur().type == TokenType::kName && Look().type == TokenType::kOperator &&
        Look().text == ".") {
      s->targets.push_back(Cur().text);
      Next();
      Next();
      s->ns_attr = ExpectName();
      return;
    }
    const bool paren = SkipOp("(");
    while (true) {
      s->targets.push_back(ExpectName());
      if (!SkipOp(",")) break;
      s->unpack = true;
      if (Cur().type != TokenType::kName) break;
    }
    if (paren) {
      ExpectOp(")");
      if (s->targets.size() > 1) s->unpack = true;
    }
    for (const std::string& t : s->targets) {
      if (t == "true" || t == "false" || t == "none" || t == "True" || t == "False" || t == "None") {
        Throw("cannot assign to '" + t + "'");
      }
    }
  }

  void ParseParams(Stmt* s) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!s->params.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      MacroParam p;
      p.name = ExpectName();
      if (SkipOp("=")) p.default_value = ParseExpression(true);
      else if (!s->params.empty() && s->params.back().default_value) {
        Throw("non-default argument follows default argument");
      }
      s->params.push_back(std::move(p));
    }
    ExpectOp(")");
  }

  bool IsTupleEnd(const std::vector<std::string>& extra_end) const {
    const Token& t = Cur();
    if (t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd || t.type == TokenType::kEof) {
      return true;
    }
    if (t.type == TokenType::kOperator && t.text == ")") return true;
    if (t.type == TokenType::kName) {
      for (const std::string& e : extra_end) {
        if (t.text == e) return true;
      }
    }
    return false;
  }

  ExprPtr ParseTuple(bool with_condexpr, const std::vector<std::string>& extra_end,
                     bool explicit_parens) {
    const int line = Cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end)) break;
      args.push_back(with_condexpr ? ParseExpression(true) : ParseOr());
      if (IsOp(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) Throw("expected an expression, got " + Describe(Cur()));
    }
    ExprPtr t = Make(ExprKind::kTuple, line);
    t->args = std::move(args);
    return Check(std::move(t));
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    DepthGuard guard(this);
    if (!with_condexpr) return ParseOr();
    ExprPtr expr = ParseOr();
    while (IsName("if")) {
      const int line = Cur().line;
      Next();
      ExprPtr cond = Make(ExprKind::kCond, line);
      cond->args.push_back(ParseOr());
      cond->args.insert(cond->args.begin() + 1, std::move(expr));
      if (SkipName("else")) cond->args.push_back(ParseExpression(true));
      else cond->args.push_back(nullptr);
      expr = Check(std::move(cond));
    }
    return expr;
  }

  ExprPtr Binary(ExprKind kind, const std::string& op, ExprPtr left, ExprPtr right, int line) {
    ExprPtr e = Make(kind, line);
    e->name = op;
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return Check(std::move(e));
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (IsName("or")) {
      const int line = Cur().line;
      Next();
      left = Binary(ExprKind::kOr, "or", std::move(left), ParseAnd(), line);
    }
    return left;
  }

  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (IsName("and")) {
      const int line = Cur().line;
      Next();
      left = Binary(ExprKind::kAnd, "and", std::move(left), ParseNot(), line);
    }
    return left;
  }

  ExprPtr ParseNot() {
    DepthGuard guard(this);
    if (IsName("not")) {
      const int line = Cur().line;
      Next();
      ExprPtr e = Make(ExprKind::kNot, line);
      e->args.push_back(ParseNot());
      return Check(std::move(e));
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const int line = Cur().line;
    ExprPtr first = ParseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOperator &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
           Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Look().type == TokenType::kName && Look().text == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(ExprKind::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(ParseMath1());
    }
    return cmp ? Check(std::move(cmp)) : std::move(first);
  }

  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      Next();
      left = Binary(ExprKind::kBinary, op, std::move(left), ParseConcat(), line);
    }
    return left;
  }

  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    while (IsOp("~")) {
      const int line = Cur().line;
      Next();
      left = Binary(ExprKind::kBinary, "~", std::move(left), ParseMath2(), line);
    }
    return left;
  }

  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      Next();
      left = Binary(ExprKind::kBinary, op, std::move(left), ParsePow(), line);
    }
    return left;
  }

  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (IsOp("**")) {
      const int line = Cur().line;
      Next();
      left = Binary(ExprKind::kBinary, "**", std::move(left), ParseUnary(true), line);
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    const int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const bool neg = IsOp("-");
      Next();
      node = Make(neg ? ExprKind::kNeg : ExprKind::kPos, line);
      node->args.push_back(ParseUnary(false));
      node = Check(std::move(node));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Cur();
    const int line = t.line;
    if (t.type == TokenType::kName) {
      ExprPtr e;
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
        e = Make(ExprKind::kConst, line);
        e->value = Value::Bool(t.text == "true" || t.text == "True");
      } else if (t.text == "none" || t.text == "None") {
        e = Make(ExprKind::kConst, line);
        e->value = Value::None();
      } else {
        e = Make(ExprKind::kName, line);
        e->name = t.text;
      }
      Next();
      return e;
    }
    if (t.type == TokenType::kString) {
      std::string s;
      while (Cur().type == TokenType::kString) {
        s += Cur().text;
        Next();
      }
      ExprPtr e = Make(ExprKind::kConst, line);
      e->value = Value::String(std::move(s));
      return e;
    }
    if (t.type == TokenType::kInt || t.type == TokenType::kFloat) {
      ExprPtr e = Make(ExprKind::kConst, line);
      e->value = t.type == TokenType::kInt ? Value::Int(t.int_value) : Value::Float(t.float_value);
      Next();
      return e;
    }
    if (IsOp("(")) {
      Next();
      ExprPtr e = ParseTuple(true, {}, true);
      ExpectOp(")");
      return e;
    }
    if (IsOp("[")) {
      Next();
      ExprPtr e = Make(ExprKind::kList, line);
      while (!IsOp("]")) {
        if (!e->args.empty()) ExpectOp(",");
        if (IsOp("]")) break;
        e->args.push_back(ParseExpression(true));
      }
      ExpectOp("]");
      return Check(std::move(e));
    }
    if (IsOp("{")) {
      Next();
      ExprPtr e = Make(ExprKind::kDict, line);
      while (!IsOp("}")) {
        if (!e->args.empty()) ExpectOp(",");
        if (IsOp("}")) break;
        e->args.push_back(ParseExpression(true));
        ExpectOp(":");
        e->args.push_back(ParseExpression(true));
      }
      ExpectOp("}");
      return Check(std::move(e));
    }
    Throw("unexpected " + Describe(t));
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        node = ParseFilterChain(std::move(node));
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    DepthGuard guard(this);
    const int line = Cur().line;
    if (SkipOp(".")) {
      if (Cur().type == TokenType::kName) {
        ExprPtr e = Make(ExprKind::kAttr, line);
        e->name = Cur().text;
        e->args.push_back(std::move(node));
        Next();
        return Check(std::move(e));
      }
      if (Cur().type == TokenType::kInt) {
        ExprPtr e = Make(ExprKind::kItem, line);
        e->args.push_back(std::move(node));
        ExprPtr key = Make(ExprKind::kConst, line);
        key->value = Value::Int(Cur().int_value);
        e->args.push_back(std::move(key));
        Next();
        return Check(std::move(e));
      }
      Throw("expected a name or number after '.', got " + Describe(Cur()));
    }
    ExpectOp("[");
    ExprPtr result;
    // A slice [a:b:c] (each part optional), or a key (several = a tuple key).
    ExprPtr parts[3];
    bool slice = false;
    if (!IsOp(":")) parts[0] = ParseExpression(true);
    if (IsOp(":")) {
      slice = true;
      Next();
      if (!IsOp("]") && !IsOp(":")) parts[1] = ParseExpression(true);
      if (SkipOp(":")) {
        if (!IsOp("]")) parts[2] = ParseExpression(true);
      }
    }
    if (slice) {
      result = Make(ExprKind::kSlice, line);
      result->args.push_back(std::move(node));
      for (auto& p : parts) result->args.push_back(std::move(p));
    } else {
      ExprPtr key = std::move(parts[0]);
      if (IsOp(",")) {
        ExprPtr tuple = Make(ExprKind::kTuple, line);
        tuple->args.push_back(std::move(key));
        while (SkipOp(",")) {
          if (IsOp("]")) break;
          tuple->args.push_back(ParseExpression(true));
        }
        key = std::move(tuple);
      }
      result = Make(ExprKind::kItem, line);
      result->args.push_back(std::move(node));
      result->args.push_back(std::move(key));
    }
    ExpectOp("]");
    return Check(std::move(result));
  }

  // Arguments "(...)" into e->args (after what is already there), kwargs, star, starstar.
  void ParseCallArgs(Expr* e) {
    ExpectOp("(");
    bool need_comma = false;
    while (!IsOp(")")) {
      if (need_comma) {
        ExpectOp(",");
        if (IsOp(")")) break;
      }
      if (SkipOp("*")) {
        e->star = ParseExpression(true);
      } else if (SkipOp("**")) {
        e->starstar = ParseExpression(true);
      } else if (Cur().type == TokenType::kName && Look().type == TokenType::kOperator &&
                 Look().text == "=") {
        std::string key = Cur().text;
        Next();
        Next();
        e->kwargs.emplace_back(std::move(key), ParseExpression(true));
      } else {
        if (e->star || e->starstar || !e->kwargs.empty()) {
          Throw("a positional argument follows keyword arguments");
        }
        e->args.push_back(ParseExpression(true));
      }
      need_comma = true;
    }
    ExpectOp(")");
  }

  ExprPtr ParseCall(ExprPtr callee) {
    DepthGuard guard(this);
    ExprPtr e = Make(ExprKind::kCall, Cur().line);
    e->args.push_back(std::move(callee));
    ParseCallArgs(e.get());
    return Check(std::move(e));
  }

  std::string DottedName() {
    std::string name = ExpectName();
    while (IsOp(".") && Look().type == TokenType::kName) {
      Next();
      name += "." + Cur().text;
      Next();
    }
    return name;
  }

  // One or more "| name(args)"; with leading_pipe the current token is the first '|'.
  ExprPtr ParseFilterChain(ExprPtr subject, bool leading_pipe = true) {
    if (leading_pipe) ExpectOp("|");
    while (true) {
      ExprPtr e = Make(ExprKind::kFilter, Cur().line);
      e->name = DottedName();
      e->args.push_back(std::move(subject));
      if (IsOp("(")) ParseCallArgs(e.get());
      subject = Check(std::move(e));
      if (!SkipOp("|")) return subject;
    }
  }

  ExprPtr ParseTest(ExprPtr subject) {
    DepthGuard guard(this);
    ExprPtr e = Make(ExprKind::kTest, Cur().line);
    Next();  // is
    if (SkipName("not")) e->negated = true;
    e->name = DottedName();
    e->args.push_back(std::move(subject));
    const Token& t = Cur();
    if (IsOp("(")) {
      ParseCallArgs(e.get());
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                t.type == TokenType::kInt || t.type == TokenType::kFloat || IsOp("(") || IsOp("[") ||
                IsOp("{")) &&
               !(t.type == TokenType::kName &&
                 (t.text == "else" || t.text == "or" || t.text == "and"))) {
      if (IsName("is")) Throw("you cannot chain multiple tests with is");
      ExprPtr arg = ParsePostfix(ParsePrimary());
      e->args.push_back(std::move(arg));
    }
    return Check(std::move(e));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<Body> ParseTemplate(std::string_view source) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  try {
    Parser parser(std::move(tokens));
    return parser.ParseAll();
  } catch (const Error& e) {
    return InvalidArgument("line " + std::to_string(e.line()) + ": " + e.what());
  }
}

}  // namespace tandem::jinja
