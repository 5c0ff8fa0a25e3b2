// Unique names for shared-memory segments in tests, so parallel test runs
// never collide: "<prefix>_t<pid>_<counter>_<random>".
#pragma once

#include <unistd.h>

#include <atomic>
#include <random>
#include <string>

namespace symtp::testing {

inline std::string UniqueName(const std::string& prefix = "symtp_test") {
  static std::atomic<int> counter{0};
  std::random_device rd;
  return prefix + "_t" + std::to_string(getpid()) + "_" + std::to_string(counter++) + "_" +
         std::to_string(rd() % 1000000);
}

}  // namespace symtp::testing
