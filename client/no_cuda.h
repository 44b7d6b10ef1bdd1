// The error of the client's GPU entry points in a build without CUDA.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ember {

inline absl::Status NoCuda(absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": this build has no CUDA (EMBER_ENABLE_CUDA=OFF)"));
}

}  // namespace ember
