// A minimal SVG writer for kvx eval's plots (no dependencies: an SVG file is
// XML text), plus a small XML well-formedness check used by the tests.
//
// Coordinates are user units with the origin at the top left, y downwards.
// Every string argument is XML-escaped; colours are CSS strings ("#1a9850",
// "none"). Numbers are written with at most two decimals, so the output is
// deterministic.
//
// Thread-safety: Svg is a value type; the functions are pure.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvx::eval {

// Escapes & < > " ' for text and attribute values.
std::string XmlEscape(std::string_view text);

class Svg {
 public:
  Svg(double width, double height);

  // `title` (optional) becomes a <title> child: a tooltip in browsers.
  void Rect(double x, double y, double w, double h, std::string_view fill, std::string_view stroke = "none",
            double stroke_width = 0, std::string_view title = "");
  void Line(double x1, double y1, double x2, double y2, std::string_view stroke, double width = 1,
            std::string_view dash = "");
  void Polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke, double width = 1,
                std::string_view dash = "");
  void Circle(double cx, double cy, double r, std::string_view fill, std::string_view stroke = "none",
              std::string_view title = "");
  // anchor: "start", "middle" or "end"; rotate: degrees about (x, y).
  void Text(double x, double y, std::string_view text, double size = 12, std::string_view anchor = "start",
            std::string_view fill = "#222", double rotate = 0, bool bold = false);

  // The complete document (XML declaration, <svg> root with a white
  // background, the elements in the order they were added).
  std::string Finish() const;

 private:
  double width_, height_;
  std::string body_;
};

// Checks that `doc` is well-formed XML as far as kvx's own writers need: one
// root element, properly nested and closed tags, quoted attributes, known
// entities (&amp; &lt; &gt; &quot; &apos; &#N; &#xN;), no stray '<' or '&'.
// Skips the <?xml ...?> declaration and comments. On failure returns false and
// describes the first problem in *error (when not null).
bool XmlWellFormed(std::string_view doc, std::string* error);

// A number with at most `decimals` decimals, trailing zeros dropped ("12.5",
// "3", "-0.25").
std::string FormatNumber(double v, int decimals = 2);

}  // namespace kvx::eval
