#include "eval/svg.h"

#include <gtest/gtest.h>

#include <cmath>

#include "eval/plots.h"

namespace kvx::eval {
namespace {

TEST(SvgTest, EscapesText) {
  EXPECT_EQ(XmlEscape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
  EXPECT_EQ(XmlEscape(std::string("x\x01y")), "x y");  // control characters are not XML
}

TEST(SvgTest, DocumentIsWellFormed) {
  Svg svg(200, 100);
  svg.Rect(1, 2, 3, 4, "#fff", "#000", 1, "tip <&>");
  svg.Line(0, 0, 10, 10, "#000", 1, "4,2");
  svg.Polyline({{0, 0}, {1.5, 2.25}}, "red");
  svg.Circle(5, 5, 2, "blue", "none", "codec=f16;policy=\"x\"");
  svg.Text(5, 5, "PPL < 10 & KLD > 0", 12, "middle", "#111", -90, true);
  const std::string doc = svg.Finish();
  std::string err;
  EXPECT_TRUE(XmlWellFormed(doc, &err)) << err << "\n" << doc;
  EXPECT_NE(doc.find("PPL &lt; 10 &amp; KLD &gt; 0"), std::string::npos);
  EXPECT_NE(doc.find("points=\"0,0 1.5,2.25\""), std::string::npos);
  EXPECT_EQ(doc.rfind("</svg>\n"), doc.size() - 7);
}

TEST(SvgTest, CheckerRejectsBrokenXml) {
  std::string err;
  EXPECT_FALSE(XmlWellFormed("<a><b></a></b>", &err));
  EXPECT_NE(err.find("does not match"), std::string::npos);
  EXPECT_FALSE(XmlWellFormed("<a x=1/>", &err));
  EXPECT_FALSE(XmlWellFormed("<a>&nbsp;</a>", &err));
  EXPECT_FALSE(XmlWellFormed("<a>", &err));
  EXPECT_FALSE(XmlWellFormed("<a/><b/>", &err));
  EXPECT_FALSE(XmlWellFormed("", &err));
  EXPECT_FALSE(XmlWellFormed("<a x=\"1\" x=\"2\"/>", &err));
  EXPECT_TRUE(XmlWellFormed("<?xml version=\"1.0\"?>\n<!-- c --><a x='1'>t &amp; &#60; &#x3C;<b/></a>\n", &err)) << err;
}

TEST(SvgTest, FormatNumber) {
  EXPECT_EQ(FormatNumber(12.5), "12.5");
  EXPECT_EQ(FormatNumber(3.0), "3");
  EXPECT_EQ(FormatNumber(-0.001), "0");
  EXPECT_EQ(FormatNumber(1.23456, 3), "1.235");
  EXPECT_EQ(FormatNumber(NAN), "0");
}

TEST(PlotsTest, ParetoFrontier) {
  // bytes, value (lower is better): (100, 5) (50, 6) (50, 7) (200, 4) (150, 5.5)
  std::vector<ParetoPoint> p = {{0, 100, 5}, {1, 50, 6}, {2, 50, 7}, {3, 200, 4}, {4, 150, 5.5}};
  EXPECT_EQ(ParetoFrontier(p, false), (std::vector<size_t>{1, 0, 3}));
  // higher is better: (50, 7) beats everything with more bytes except (none higher)
  EXPECT_EQ(ParetoFrontier(p, true), (std::vector<size_t>{2}));
  EXPECT_TRUE(ParetoFrontier({}, true).empty());
}

TEST(PlotsTest, NiceTicksAndBytes) {
  EXPECT_EQ(NiceTicks(0, 10, 6), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(NiceTicks(0, 1, 5), (std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(NiceTicks(3, 3, 5), (std::vector<double>{3}));
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(3.25 * 1024 * 1024), "3.25 MiB");
  EXPECT_EQ(HeatColor(0), "#d73027");
  EXPECT_EQ(HeatColor(1), "#1a9850");
  EXPECT_EQ(HeatColor(0.5), "#fee08b");
  EXPECT_EQ(HeatColor(NAN), "#d9d9d9");
}

TEST(PlotsTest, ChartsAreWellFormedSvg) {
  ParetoChart chart;
  chart.title = "Quality <vs> KV & bytes";
  chart.legend = {"codec=f32 (baseline)", "codec=f16", "codec=int4,group=32"};
  ParetoPanel ppl{"PPL", false, false, {{0, 1 << 20, 10.5}, {1, 1 << 19, 10.51}, {2, 1 << 17, 11.2}}};
  ParetoPanel acc{"copy", true, true, {{0, 1 << 20, 0.9}, {1, 1 << 19, 0.9}, {2, 1 << 17, 0.4}}};
  ParetoPanel one{"single", true, false, {{0, 100, NAN}}};
  chart.panels = {ppl, acc, one};
  std::string err;
  const std::string svg = RenderParetoSvg(chart);
  EXPECT_TRUE(XmlWellFormed(svg, &err)) << err;
  EXPECT_NE(svg.find("Quality &lt;vs&gt; KV &amp; bytes"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);  // a frontier was drawn

  HeatMapData h;
  h.title = "needle";
  h.x_labels = {"128", "256"};
  h.y_labels = {"0%", "50%", "100%"};
  h.values = {{1.0, 0.5}, {0.0, NAN}, {0.25}};
  const std::string heat = RenderHeatMapSvg(h);
  EXPECT_TRUE(XmlWellFormed(heat, &err)) << err;
  EXPECT_NE(heat.find("n/a"), std::string::npos);
  EXPECT_NE(heat.find(">0.50<"), std::string::npos);
}

}  // namespace
}  // namespace kvx::eval
