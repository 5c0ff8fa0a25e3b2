// Leveled logging with a subsystem tag.
//
//   SYMTP_LOG(INFO, "ipc") << "ring formatted, " << bytes << " bytes";
//
// Levels: ERROR < WARN < INFO < DEBUG < TRACE. The threshold comes from the
// SYMTP_LOG environment variable (read once, see common/env.h), e.g.
//   SYMTP_LOG=warn              everything at WARN and above
//   SYMTP_LOG=info,ipc=trace    INFO by default, TRACE for subsystem "ipc"
// Default: INFO. Lines go to stderr, one write(2) each, prefixed with time,
// pid, level, subsystem and file:line, so lines from many processes interleave
// whole.
#pragma once

#include <sstream>
#include "absl/strings/string_view.h"

namespace symtp {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

// True when a message at `level` for `subsystem` would be written.
bool LogEnabled(LogLevel level, absl::string_view subsystem);

// Overrides the environment (tests, tools with a --verbose flag).
void SetLogSpec(absl::string_view spec);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* subsystem, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* subsystem_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};
// Turns `stream << ...` into void so SYMTP_LOG is one expression (safe as the
// body of an unbraced if/else).
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace internal
}  // namespace symtp

#define SYMTP_LOG_LEVEL_ERROR ::symtp::LogLevel::kError
#define SYMTP_LOG_LEVEL_WARN ::symtp::LogLevel::kWarn
#define SYMTP_LOG_LEVEL_INFO ::symtp::LogLevel::kInfo
#define SYMTP_LOG_LEVEL_DEBUG ::symtp::LogLevel::kDebug
#define SYMTP_LOG_LEVEL_TRACE ::symtp::LogLevel::kTrace

#define SYMTP_LOG(level, subsystem)                                                       \
  !::symtp::LogEnabled(SYMTP_LOG_LEVEL_##level, (subsystem))                              \
      ? (void)0                                                                           \
      : ::symtp::internal::LogVoidify() &                                                 \
            ::symtp::internal::LogMessage(SYMTP_LOG_LEVEL_##level, (subsystem), __FILE__, \
                                          __LINE__)                                       \
                .stream()
