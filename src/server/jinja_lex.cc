// The lexer: a template into text and tags (Split), a tag's body into
// tokens (Lex).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "server/jinja_ast.h"

namespace kvx::server::jinja {

std::vector<Tok> Lex(const std::string& src, int line) {
  std::vector<Tok> out;
  size_t p = 0;
  while (p < src.size()) {
    const char c = src[p];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++p;
      continue;
    }
    Tok t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = p;
      while (q < src.size() && (std::isalnum(static_cast<unsigned char>(src[q])) || src[q] == '_')) ++q;
      t.kind = Tok::kName;
      t.text = src.substr(p, q - p);
      p = q;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t q = p;
      while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) ++q;
      if (q + 1 < src.size() && src[q] == '.' && std::isdigit(static_cast<unsigned char>(src[q + 1]))) {
        ++q;
        while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) ++q;
        t.kind = Tok::kFloat;
        t.d = std::strtod(src.substr(p, q - p).c_str(), nullptr);  // too large: inf, as in Python
      } else {
        t.kind = Tok::kInt;
        for (size_t k = p; k < q; ++k) {
          if (__builtin_mul_overflow(t.i, 10, &t.i) || __builtin_add_overflow(t.i, src[k] - '0', &t.i)) {
            Fail("integer literal out of range (template integers are 64-bit): " +
                     src.substr(p, std::min<size_t>(q - p, 40)), line);
          }
        }
      }
      p = q;
    } else if (c == '\'' || c == '"') {
      size_t q = p + 1;
      std::string s;
      while (q < src.size() && src[q] != c) {
        if (src[q] == '\\' && q + 1 < src.size()) {
          const char e = src[++q];
          s += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          s += src[q];
        }
        ++q;
      }
      if (q >= src.size()) Fail("unterminated string", line);
      t.kind = Tok::kString;
      t.text = std::move(s);
      p = q + 1;
    } else {
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ",", ":", ".",
                                   "|", "~", "+", "-", "*", "/", "%", "<", ">", "="};
      bool found = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (src.compare(p, n, op) == 0) {
          t.kind = Tok::kOp;
          t.text = op;
          p += n;
          found = true;
          break;
        }
      }
      if (!found) Fail(std::string("unexpected character '") + c + "'", line);
    }
    out.push_back(std::move(t));
  }
  out.push_back(Tok{});
  return out;
}

std::pair<size_t, size_t> StripBounds(const std::string& s, const std::string& chars, bool left, bool right) {
  // A table, not chars.find per byte: a template may strip a long text by a long set.
  bool strip[256] = {};
  for (unsigned char c : chars) strip[c] = true;
  size_t a = 0, z = s.size();
  if (left) {
    while (a < z && strip[static_cast<unsigned char>(s[a])]) ++a;
  }
  if (right) {
    while (z > a && strip[static_cast<unsigned char>(s[z - 1])]) --z;
  }
  return {a, z};
}

std::string Strip(const std::string& s, const std::string& chars, bool left, bool right) {
  const auto [a, z] = StripBounds(s, chars, left, right);
  return s.substr(a, z - a);
}

std::vector<Piece> Split(const std::string& src) {
  std::vector<Piece> out;
  size_t p = 0;
  int line = 1;
  bool trim_next = false;      // a '-' closer: strip the next text's leading whitespace
  bool newline_next = false;   // trim_blocks: drop one newline after a block tag
  auto count_lines = [&](size_t a, size_t b) {
    for (size_t k = a; k < b; ++k) line += src[k] == '\n';
  };
  while (p <= src.size()) {
    size_t open = src.find('{', p);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
           src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open != std::string::npos && open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(p, open == std::string::npos ? std::string::npos : open - p);
    const int text_line = line;
    count_lines(p, open == std::string::npos ? src.size() : open);
    const bool starts_line = p == 0 || src[p - 1] == '\n' || (newline_next && p < src.size() && src[p] == '\n');
    if (trim_next) text = Strip(text, kSpace, true, false);
    else if (newline_next && !text.empty() && text[0] == '\n') text.erase(0, 1);
    trim_next = newline_next = false;
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Piece::kText, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    const bool minus = open + 2 < src.size() && src[open + 2] == '-';
    if (minus) {
      text = Strip(text, kSpace, false, true);
    } else if (kind == '%' || kind == '#') {
      // lstrip_blocks: spaces and tabs from the line start to a block tag.
      size_t k = text.size();
      while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
      if (k > 0 ? text[k - 1] == '\n' : starts_line) text.erase(k);
    }
    if (!text.empty()) out.push_back({Piece::kText, text, text_line});
    const std::string closer = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t q = open + 2;
    char quote = 0;
    for (; q + 1 < src.size(); ++q) {
      if (kind != '#') {
        if (quote) {
          if (src[q] == '\\') ++q;
          else if (src[q] == quote) quote = 0;
          continue;
        }
        if (src[q] == '\'' || src[q] == '"') {
          quote = src[q];
          continue;
        }
      }
      if (src.compare(q, 2, closer) == 0) break;
    }
    if (q + 1 >= src.size()) Fail("a tag opened here is never closed", line);
    size_t body_start = open + 2 + (minus ? 1 : 0), body_end = q;
    const bool minus_close = body_end > body_start && src[body_end - 1] == '-';
    if (minus_close) --body_end;
    const int tag_line = line;
    count_lines(open, q + 2);
    if (kind != '#') {
      out.push_back({kind == '{' ? Piece::kExpr : Piece::kStmt, src.substr(body_start, body_end - body_start), tag_line});
    }
    trim_next = minus_close;
    newline_next = !minus_close && kind != '{';
    p = q + 2;
  }
  return out;
}

}  // namespace kvx::server::jinja
