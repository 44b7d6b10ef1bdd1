// Early-return helpers for absl::Status. Abseil 20220623 ships none.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define EMBER_STATUS_CONCAT_INNER_(a, b) a##b
#define EMBER_STATUS_CONCAT_(a, b) EMBER_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` is not OK.
#define EMBER_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::absl::Status _ember_status = (expr);           \
    if (!_ember_status.ok()) return _ember_status;   \
  } while (false)

// `lhs` = value of the StatusOr `rexpr`, or return its error.
#define EMBER_ASSIGN_OR_RETURN(lhs, rexpr) \
  EMBER_ASSIGN_OR_RETURN_IMPL_(EMBER_STATUS_CONCAT_(_ember_statusor_, __LINE__), lhs, rexpr)
#define EMBER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return statusor.status();            \
  lhs = std::move(statusor).value()
