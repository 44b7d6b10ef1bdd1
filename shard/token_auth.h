// Bearer-token authentication and roles for a shard's calls, whatever
// transport brings them (shard/shard_edge.h checks them).
//
// The tokens file (--auth_tokens_file) holds one "<token> <role>" per line;
// blank lines and lines starting with '#' are skipped. Roles, each with the
// rights of the ones before it:
//   reader   calls that write nothing: Lookup whose every table has
//            read_only = true, ListTables, GetShardInfo (serving and
//            analytics clients);
//   trainer  also Lookup that inserts rows, Push, Exchange, ExchangeStream,
//            Register/UnregisterWorker, ListCheckpoints;
//   admin    everything: also CreateTable, DropTable, Checkpoint.
// A call carries "authorization: Bearer <token>" metadata. No token, or one
// not in the file: UNAUTHENTICATED; a token whose role may not make the
// call: PERMISSION_DENIED naming the role and the call. Every refusal is
// counted in ember_auth_denied_total. Tokens never appear in messages or
// logs. The health service and reflection stay open (probes carry no token).
//
// Thread safety: Check may be called from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shard/shard_metrics.h"

namespace ember {

// In order of rights: a role may make every call of the roles before it.
enum class Role { kReader, kTrainer, kAdmin };

absl::string_view RoleName(Role role);

class TokenAuth {
 public:
  // Errors name the file and the line, never a token.
  static absl::StatusOr<std::unique_ptr<TokenAuth>> FromFile(const std::string& path);
  static absl::StatusOr<std::unique_ptr<TokenAuth>> FromText(absl::string_view text,
                                                             absl::string_view source);

  // `metrics` (null: none) must outlive this.
  void SetMetrics(ShardMetrics* metrics) { metrics_ = metrics; }

  // OK when the call's token has a role that may make `rpc`, which needs
  // `needed`; `authorization` is the call's "authorization" metadata as
  // sent (nullopt: it sent none); `why` (may be empty) says why the call
  // needs the role, for the refusal's message.
  absl::Status Check(std::optional<absl::string_view> authorization, Role needed,
                     absl::string_view rpc, absl::string_view why = "") const;

  size_t size() const { return tokens_.size(); }

 private:
  std::vector<std::pair<std::string, Role>> tokens_;
  ShardMetrics* metrics_ = nullptr;
};

}  // namespace ember
