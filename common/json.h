// The one JSON writer (summaries, traces, benchmark and tool output):
//   JsonWriter j(/*indent=*/2);
//   j.Open('{').Field("tp", 2).Field("us", 1.25, 3).Key("rows").Open('[').Value("a").Close();
//   std::string text = j.Close().Take();
// Strings are escaped (quotes, backslashes, control characters as \u00XX);
// reals that are not finite are null. indent 0 writes one line (JSON Lines),
// n pretty-prints n spaces per level. The caller nests correctly.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace symtp {

// `s` as a JSON string literal, quotes included.
std::string JsonString(std::string_view s);

class JsonWriter {
 public:
  explicit JsonWriter(int indent = 0) : indent_(indent) {}
  JsonWriter& Open(char bracket);  // '{' or '['
  JsonWriter& Close();
  JsonWriter& Key(std::string_view key);  // in an object, before each value
  JsonWriter& Value(std::string_view v) { return Raw(JsonString(v)); }
  JsonWriter& Value(const char* v) { return Raw(JsonString(v)); }
  JsonWriter& Value(const std::string& v) { return Raw(JsonString(v)); }
  JsonWriter& Value(bool v) { return Raw(v ? "true" : "false"); }
  template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
  JsonWriter& Value(T v) { return Raw(std::to_string(v)); }
  JsonWriter& Value(double v, int decimals = 6);  // fixed point
  JsonWriter& Null() { return Raw("null"); }
  JsonWriter& Raw(std::string_view json);  // a value that is JSON text already
  template <typename T>
  JsonWriter& Array(const std::vector<T>& v) {  // integers, on one line
    std::string a = "[";
    for (size_t i = 0; i < v.size(); ++i) a += (i ? "," : "") + std::to_string(v[i]);
    return Raw(a + "]");
  }
  template <typename... T>
  JsonWriter& Field(std::string_view key, const T&... v) { return Key(key).Value(v...); }
  std::string Take() { return std::move(out_); }  // no final newline

 private:
  void BeforeValue();
  int indent_;
  std::string out_, closers_;  // closers_: the open brackets' closing ones
  std::vector<int> counts_;    // values written in each open bracket
  bool after_key_ = false;
};

}  // namespace symtp
