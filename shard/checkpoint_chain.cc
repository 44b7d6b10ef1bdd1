#include "shard/checkpoint_chain.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/key_router.h"
#include "common/status_macros.h"
#include "shard/checkpoint_format.h"

namespace ember {

std::string TableFileName(const std::string& table) {
  return absl::StrCat("table-", table, ".rows");
}

std::string ParentDir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

absl::Status CheckPlacement(const v1::CheckpointManifest& m, const std::string& where) {
  if (m.shard_index() >= m.shard_count()) {
    return absl::DataLossError(absl::StrCat("checkpoint file '", where, "': shard_index ",
                                            m.shard_index(), " is not below shard_count ",
                                            m.shard_count()));
  }
  if (absl::Status s = KeyRouter::Make(m.routing(), m.shard_count()).status(); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint file '", where, "': this build cannot read its ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::CheckpointManifest>> ReadChain(FileSystem* fs,
                                                              const std::string& path) {
  std::vector<v1::CheckpointManifest> chain;
  const std::string dir = ParentDir(path);
  std::string current = path;
  while (true) {
    absl::StatusOr<v1::CheckpointManifest> read = ReadManifest(fs, current);
    if (!read.ok()) {
      if (current == path) return read.status();
      // A parent's error alone would not say which checkpoint was asked for.
      return absl::Status(read.status().code(),
                          absl::StrCat("checkpoint '", path, "': its parent '", BaseName(current),
                                       "': ", read.status().message()));
    }
    v1::CheckpointManifest m = *std::move(read);
    // A checkpoint is its directory: a copied or renamed one reads its own
    // files (LoadChain joins the id), never those of the directory it was
    // copied from.
    m.set_id(BaseName(current));
    const std::string where = JoinPath(current, kManifestFileName);
    // A delta's parents must be of the same shard, routed the same.
    if (chain.empty()) {
      EMBER_RETURN_IF_ERROR(CheckPlacement(m, where));
    } else if (m.shard_index() != chain.front().shard_index() ||
               m.shard_count() != chain.front().shard_count() ||
               m.routing() != chain.front().routing()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file '", where, "': written by shard ", m.shard_index(), " of ",
                       m.shard_count(), " routed by '", m.routing(), "', its delta '",
                       chain.front().id(), "' by shard ", chain.front().shard_index(), " of ",
                       chain.front().shard_count(), " routed by '", chain.front().routing(), "'"));
    }
    const bool delta = m.kind() == v1::CHECKPOINT_KIND_DELTA;
    if (!delta && m.kind() != v1::CHECKPOINT_KIND_FULL) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file '", where, "': unknown kind ", static_cast<int>(m.kind())));
    }
    const std::string parent = m.parent_id();
    chain.push_back(std::move(m));
    if (!delta) break;
    // The parent is a sibling directory: a name that climbs out of the
    // checkpoint directory would read whatever it points at.
    if (parent.empty() || parent == "." || parent == ".." ||
        parent.find('/') != std::string::npos || parent.find('\0') != std::string::npos) {
      return absl::DataLossError(absl::StrCat("checkpoint file '", where, "': parent_id '",
                                              absl::CHexEscape(parent),
                                              "' is not the name of a checkpoint beside it"));
    }
    if (chain.size() > 100000) {
      return absl::DataLossError(
          absl::StrCat("checkpoint '", path, "': its chain of deltas loops"));
    }
    current = JoinPath(dir, parent);
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

}  // namespace ember
