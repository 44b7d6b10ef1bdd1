#include "shard/token_auth.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/secret_compare.h"

namespace ember {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kReader:
      return "reader";
    case Role::kTrainer:
      return "trainer";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("auth_tokens_file '", path, "': cannot read"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return FromText(text.str(), absl::StrCat("auth_tokens_file '", path, "'"));
}

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::FromText(absl::string_view text,
                                                               absl::string_view source) {
  auto auth = std::make_unique<TokenAuth>();
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, " line ", line_number, ": expected '<token> <role>', received ",
          fields.size(), " fields"));
    }
    std::optional<Role> role;
    for (Role r : {Role::kReader, Role::kTrainer, Role::kAdmin}) {
      if (fields[1] == RoleName(r)) role = r;
    }
    if (!role.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, " line ", line_number,
                       ": expected role reader, trainer or admin, received '", fields[1], "'"));
    }
    if (fields[0].size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, " line ", line_number, ": expected a token of at least 16 characters, received ",
          fields[0].size()));
    }
    for (const auto& [token, r] : auth->tokens_) {
      if (token == fields[0]) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, " line ", line_number, ": the token is listed twice"));
      }
    }
    auth->tokens_.emplace_back(std::string(fields[0]), *role);
  }
  if (auth->tokens_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected at least one '<token> <role>' line, received none"));
  }
  return auth;
}

absl::Status TokenAuth::Check(std::optional<absl::string_view> authorization, Role needed,
                              absl::string_view rpc, absl::string_view why) const {
  absl::string_view presented;
  if (authorization.has_value() && absl::StartsWith(*authorization, kBearer)) {
    presented = authorization->substr(kBearer.size());
  }
  const std::pair<std::string, Role>* match = nullptr;
  for (const auto& entry : tokens_) {
    if (SameSecret(entry.first, presented)) match = &entry;
  }
  absl::Status status;
  if (match == nullptr) {
    status = absl::UnauthenticatedError(absl::StrCat(
        rpc, ": ", !authorization.has_value() ? "no 'authorization' metadata"
                                        : "the bearer token is not one this shard knows",
        "; expected 'authorization: Bearer <token>' with a token of --auth_tokens_file"));
  } else if (match->second < needed) {
    status = absl::PermissionDeniedError(absl::StrCat(
        rpc, ": expected role ", RoleName(needed), needed == Role::kAdmin ? "" : " or above",
        why.empty() ? "" : absl::StrCat(" (", why, ")"), ", received a token of role ",
        RoleName(match->second)));
  }
  if (!status.ok() && metrics_ != nullptr) metrics_->RecordAuthDenied(rpc, status.code());
  return status;
}

}  // namespace ember
