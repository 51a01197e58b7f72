#ifndef HYBRIDSERVE_COMMON_STATUS_MACROS_H_
#define HYBRIDSERVE_COMMON_STATUS_MACROS_H_

// RETURN_IF_ERROR / ASSIGN_OR_RETURN for abseil LTS 20220623, which has neither.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HS_STATUS_CONCAT_INNER_(a, b) a##b
#define HS_STATUS_CONCAT_(a, b) HS_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function
// when it is not OK.
#define RETURN_IF_ERROR(expr)                                    \
  do {                                                           \
    ::absl::Status hs_status_ = (expr);                          \
    if (ABSL_PREDICT_FALSE(!hs_status_.ok())) return hs_status_; \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on error
// returns its status, otherwise moves the value into `lhs` (which may declare a
// variable, e.g. `auto x`).
#define ASSIGN_OR_RETURN(lhs, expr) HS_ASSIGN_OR_RETURN_IMPL_(HS_STATUS_CONCAT_(hs_statusor_, __LINE__), lhs, expr)

#define HS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)              \
  auto statusor = (expr);                                           \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) return statusor.status(); \
  lhs = std::move(statusor).value()

#endif  // HYBRIDSERVE_COMMON_STATUS_MACROS_H_
