#include "common/json.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace symtp {

std::string JsonString(std::string_view s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += {'\\', c};
    else if (static_cast<unsigned char>(c) < 0x20) absl::StrAppendFormat(&o, "\\u%04x", c);
    else o.push_back(c);
  }
  return o + "\"";
}

void JsonWriter::BeforeValue() {
  if (after_key_ || counts_.empty()) {
    after_key_ = false;
    return;
  }
  if (counts_.back()++ > 0) out_ += ",";
  if (indent_ > 0) out_ += "\n" + std::string(counts_.size() * indent_, ' ');
}

JsonWriter& JsonWriter::Open(char bracket) {
  BeforeValue();
  out_ += bracket;
  counts_.push_back(0);
  closers_.push_back(bracket == '{' ? '}' : ']');
  return *this;
}

JsonWriter& JsonWriter::Close() {
  const bool empty = counts_.back() == 0;
  counts_.pop_back();
  if (!empty && indent_ > 0) out_ += "\n" + std::string(counts_.size() * indent_, ' ');
  out_ += closers_.back();
  closers_.pop_back();
  return *this;
}

JsonWriter& JsonWriter::Key(std::string_view key) {
  BeforeValue();
  out_ += JsonString(key) + (indent_ > 0 ? ": " : ":");
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::Value(double v, int decimals) {
  return std::isfinite(v) ? Raw(absl::StrFormat("%.*f", decimals, v)) : Null();
}

JsonWriter& JsonWriter::Raw(std::string_view json) {
  BeforeValue();
  out_ += json;
  return *this;
}

}  // namespace symtp
