// GoogleTest matchers for absl::Status / StatusOr (the LTS 2022 Abseil has no
// public ones).
//
//   EXPECT_THAT(DoIt(), IsOk());
//   EXPECT_THAT(DoIt(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("rank 2")));
//   ASSERT_OK_AND_ASSIGN(auto ring, Ring::Create(...));
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace symtp::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) { return s.status(); }

MATCHER(IsOk, "is OK") {
  const absl::Status& s = ::symtp::testing::GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s.ToString();
  return s.ok();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + std::string(absl::StatusCodeToString(code))) {
  const absl::Status& s = ::symtp::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(s.message()),
                                       result_listener);
}

}  // namespace symtp::testing

#define SYMTP_TESTING_CONCAT_INNER_(a, b) a##b
#define SYMTP_TESTING_CONCAT_(a, b) SYMTP_TESTING_CONCAT_INNER_(a, b)
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::symtp::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::symtp::testing::IsOk())
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                          \
  auto SYMTP_TESTING_CONCAT_(statusor_, __LINE__) = (expr);                      \
  ASSERT_OK(SYMTP_TESTING_CONCAT_(statusor_, __LINE__));                         \
  lhs = std::move(*SYMTP_TESTING_CONCAT_(statusor_, __LINE__))
