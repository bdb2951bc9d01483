#include "eval/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace kvx::eval {

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters other than tab/newline are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string FormatNumber(double v, int decimals) {
  if (!std::isfinite(v)) return "0";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

namespace {
std::string N(double v) { return FormatNumber(v, 2); }
std::string Attr(std::string_view name, std::string_view value) {
  return " " + std::string(name) + "=\"" + XmlEscape(value) + "\"";
}
}  // namespace

Svg::Svg(double width, double height) : width_(width), height_(height) {}

void Svg::Rect(double x, double y, double w, double h, std::string_view fill, std::string_view stroke,
               double stroke_width, std::string_view title) {
  body_ += "<rect" + Attr("x", N(x)) + Attr("y", N(y)) + Attr("width", N(std::max(0.0, w))) +
           Attr("height", N(std::max(0.0, h))) + Attr("fill", fill);
  if (stroke != "none" && stroke_width > 0) body_ += Attr("stroke", stroke) + Attr("stroke-width", N(stroke_width));
  if (title.empty()) {
    body_ += "/>\n";
  } else {
    body_ += "><title>" + XmlEscape(title) + "</title></rect>\n";
  }
}

void Svg::Line(double x1, double y1, double x2, double y2, std::string_view stroke, double width,
               std::string_view dash) {
  body_ += "<line" + Attr("x1", N(x1)) + Attr("y1", N(y1)) + Attr("x2", N(x2)) + Attr("y2", N(y2)) +
           Attr("stroke", stroke) + Attr("stroke-width", N(width));
  if (!dash.empty()) body_ += Attr("stroke-dasharray", dash);
  body_ += "/>\n";
}

void Svg::Polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke, double width,
                   std::string_view dash) {
  std::string pts;
  for (const auto& [x, y] : points) {
    if (!pts.empty()) pts += ' ';
    pts += N(x) + "," + N(y);
  }
  body_ += "<polyline" + Attr("points", pts) + Attr("fill", "none") + Attr("stroke", stroke) +
           Attr("stroke-width", N(width));
  if (!dash.empty()) body_ += Attr("stroke-dasharray", dash);
  body_ += "/>\n";
}

void Svg::Circle(double cx, double cy, double r, std::string_view fill, std::string_view stroke,
                 std::string_view title) {
  body_ += "<circle" + Attr("cx", N(cx)) + Attr("cy", N(cy)) + Attr("r", N(r)) + Attr("fill", fill);
  if (stroke != "none") body_ += Attr("stroke", stroke) + Attr("stroke-width", "1");
  if (title.empty()) {
    body_ += "/>\n";
  } else {
    body_ += "><title>" + XmlEscape(title) + "</title></circle>\n";
  }
}

void Svg::Text(double x, double y, std::string_view text, double size, std::string_view anchor, std::string_view fill,
               double rotate, bool bold) {
  body_ += "<text" + Attr("x", N(x)) + Attr("y", N(y)) + Attr("font-size", N(size)) + Attr("text-anchor", anchor) +
           Attr("fill", fill);
  if (bold) body_ += Attr("font-weight", "bold");
  if (rotate != 0) body_ += Attr("transform", "rotate(" + N(rotate) + " " + N(x) + " " + N(y) + ")");
  body_ += ">" + XmlEscape(text) + "</text>\n";
}

std::string Svg::Finish() const {
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\"" + Attr("width", N(width_)) + Attr("height", N(height_)) +
         Attr("viewBox", "0 0 " + N(width_) + " " + N(height_)) +
         Attr("font-family", "DejaVu Sans, Helvetica, Arial, sans-serif") + ">\n";
  out += "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  out += body_;
  out += "</svg>\n";
  return out;
}

// ---- well-formedness check ----

namespace {

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

class XmlChecker {
 public:
  explicit XmlChecker(std::string_view doc) : s_(doc) {}

  bool Run(std::string* error) {
    bool ok = Check();
    if (!ok && error) *error = error_ + " (at byte " + std::to_string(i_) + ")";
    return ok;
  }

 private:
  bool Fail(std::string msg) {
    error_ = std::move(msg);
    return false;
  }

  // An entity reference starting at s_[i_] == '&'; advances past it.
  bool Entity() {
    const size_t semi = s_.find(';', i_);
    if (semi == std::string_view::npos || semi - i_ > 12) return Fail("unterminated entity");
    std::string_view name = s_.substr(i_ + 1, semi - i_ - 1);
    bool ok = name == "amp" || name == "lt" || name == "gt" || name == "quot" || name == "apos";
    if (!ok && name.size() >= 2 && name[0] == '#') {
      ok = true;
      const bool hex = name[1] == 'x';
      for (size_t k = hex ? 2 : 1; k < name.size(); ++k) {
        const char c = name[k];
        const bool digit = (c >= '0' && c <= '9') || (hex && ((c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')));
        if (!digit) ok = false;
      }
      if (name.size() == (hex ? 2u : 1u)) ok = false;
    }
    if (!ok) return Fail("unknown entity &" + std::string(name) + ";");
    i_ = semi + 1;
    return true;
  }

  bool Name(std::string* out) {
    if (i_ >= s_.size() || !IsNameStart(s_[i_])) return Fail("expected a name");
    const size_t start = i_;
    while (i_ < s_.size() && IsNameChar(s_[i_])) ++i_;
    *out = std::string(s_.substr(start, i_ - start));
    return true;
  }

  void SkipSpace() {
    while (i_ < s_.size() && IsSpace(s_[i_])) ++i_;
  }

  // After '<' + name: attributes up to '>' or '/>'. Sets *self_closing.
  bool Attributes(bool* self_closing) {
    std::vector<std::string> seen;
    while (true) {
      const size_t before = i_;
      SkipSpace();
      if (i_ >= s_.size()) return Fail("unterminated tag");
      if (s_[i_] == '>') {
        ++i_;
        *self_closing = false;
        return true;
      }
      if (s_.substr(i_, 2) == "/>") {
        i_ += 2;
        *self_closing = true;
        return true;
      }
      if (i_ == before) return Fail("expected whitespace before an attribute");
      std::string name;
      if (!Name(&name)) return false;
      for (const std::string& s : seen) {
        if (s == name) return Fail("duplicate attribute " + name);
      }
      seen.push_back(name);
      SkipSpace();
      if (i_ >= s_.size() || s_[i_] != '=') return Fail("attribute " + name + " has no value");
      ++i_;
      SkipSpace();
      if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) return Fail("attribute value must be quoted");
      const char quote = s_[i_++];
      while (i_ < s_.size() && s_[i_] != quote) {
        if (s_[i_] == '<') return Fail("'<' inside an attribute value");
        if (s_[i_] == '&') {
          if (!Entity()) return false;
        } else {
          ++i_;
        }
      }
      if (i_ >= s_.size()) return Fail("unterminated attribute value");
      ++i_;
    }
  }

  bool Check() {
    std::vector<std::string> stack;
    bool seen_root = false;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '<') {
        if (s_.substr(i_, 5) == "<?xml") {
          if (i_ != 0) return Fail("XML declaration not at the start");
          const size_t end = s_.find("?>", i_);
          if (end == std::string_view::npos) return Fail("unterminated XML declaration");
          i_ = end + 2;
          continue;
        }
        if (s_.substr(i_, 4) == "<!--") {
          const size_t end = s_.find("-->", i_ + 4);
          if (end == std::string_view::npos) return Fail("unterminated comment");
          i_ = end + 3;
          continue;
        }
        if (s_.substr(i_, 2) == "</") {
          i_ += 2;
          std::string name;
          if (!Name(&name)) return false;
          SkipSpace();
          if (i_ >= s_.size() || s_[i_] != '>') return Fail("malformed end tag </" + name);
          ++i_;
          if (stack.empty() || stack.back() != name) {
            return Fail("end tag </" + name + "> does not match " +
                        (stack.empty() ? std::string("anything") : "<" + stack.back() + ">"));
          }
          stack.pop_back();
          continue;
        }
        ++i_;
        std::string name;
        if (!Name(&name)) return false;
        if (stack.empty()) {
          if (seen_root) return Fail("more than one root element");
          seen_root = true;
        }
        bool self_closing = false;
        if (!Attributes(&self_closing)) return false;
        if (!self_closing) stack.push_back(name);
        continue;
      }
      if (c == '&') {
        if (!Entity()) return false;
        continue;
      }
      if (stack.empty() && !IsSpace(c)) return Fail("text outside the root element");
      ++i_;
    }
    if (!stack.empty()) return Fail("element <" + stack.back() + "> is not closed");
    if (!seen_root) return Fail("no root element");
    return true;
  }

  std::string_view s_;
  size_t i_ = 0;
  std::string error_;
};

}  // namespace

bool XmlWellFormed(std::string_view doc, std::string* error) { return XmlChecker(doc).Run(error); }

}  // namespace kvx::eval
