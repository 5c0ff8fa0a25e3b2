#include "common/log.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "common/env.h"
#include "common/status_macros.h"

namespace symtp {
namespace {

struct LogConfig {
  LogLevel default_level = LogLevel::kInfo;
  std::vector<std::pair<std::string, LogLevel>> per_subsystem;
};

bool ParseLevel(absl::string_view s, LogLevel* out) {
  std::string l = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s));
  if (l == "error") *out = LogLevel::kError;
  else if (l == "warn" || l == "warning") *out = LogLevel::kWarn;
  else if (l == "info") *out = LogLevel::kInfo;
  else if (l == "debug") *out = LogLevel::kDebug;
  else if (l == "trace") *out = LogLevel::kTrace;
  else return false;
  return true;
}

LogConfig Parse(absl::string_view spec) {
  LogConfig cfg;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    auto eq = part.find('=');
    LogLevel lvl;
    if (eq == absl::string_view::npos) {
      if (ParseLevel(part, &lvl)) cfg.default_level = lvl;
    } else if (ParseLevel(part.substr(eq + 1), &lvl)) {
      cfg.per_subsystem.emplace_back(std::string(absl::StripAsciiWhitespace(part.substr(0, eq))),
                                     lvl);
    }
  }
  return cfg;
}

std::mutex& ConfigMutex() {
  static std::mutex m;
  return m;
}

LogConfig& Config() {
  static LogConfig cfg = Parse(env::LogSpec());
  return cfg;
}

const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "E";
    case LogLevel::kWarn: return "W";
    case LogLevel::kInfo: return "I";
    case LogLevel::kDebug: return "D";
    case LogLevel::kTrace: return "T";
  }
  return "?";
}

}  // namespace

bool LogEnabled(LogLevel level, absl::string_view subsystem) {
  std::lock_guard<std::mutex> lock(ConfigMutex());
  const LogConfig& cfg = Config();
  LogLevel threshold = cfg.default_level;
  for (const auto& [name, lvl] : cfg.per_subsystem) {
    if (name == subsystem) threshold = lvl;
  }
  return static_cast<int>(level) <= static_cast<int>(threshold);
}

void SetLogSpec(absl::string_view spec) {
  std::lock_guard<std::mutex> lock(ConfigMutex());
  Config() = Parse(spec);
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* subsystem, const char* file, int line)
    : level_(level), subsystem_(subsystem), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm t;
  localtime_r(&ts.tv_sec, &t);
  char head[64];
  std::snprintf(head, sizeof(head), "%02d:%02d:%02d.%06ld", t.tm_hour, t.tm_min, t.tm_sec,
                ts.tv_nsec / 1000);
  std::string line = std::string(LevelName(level_)) + " " + head + " " +
                     std::to_string(getpid()) + " [" + subsystem_ + "] " +
                     SourceLocation(file_, line_) + "] " + stream_.str() + "\n";
  // One write so that concurrent processes do not interleave within a line.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace internal
}  // namespace symtp
