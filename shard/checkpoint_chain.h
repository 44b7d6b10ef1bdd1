// A checkpoint's chain on disk: the checkpoint and, for a delta, its
// parents back to its full checkpoint. Shared by the checkpointer (restore,
// verify, load) and the reshard (shard/reshard.h).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/file_system.h"
#include "ember/v1/checkpoint.pb.h"

namespace ember {

// The data file of `table` in a checkpoint directory.
std::string TableFileName(const std::string& table);
// The directory a checkpoint (and so its parents) lives in.
std::string ParentDir(const std::string& path);
// The last component of `path` (trailing slashes ignored).
std::string BaseName(const std::string& path);

// OK if the manifest's shard index is below its count and its routing is
// one this build knows; else DATA_LOSS or FAILED_PRECONDITION naming `where`
// (its MANIFEST file).
absl::Status CheckPlacement(const v1::CheckpointManifest& m, const std::string& where);

// Reads the manifests of the checkpoint at `path` and of its parents, base
// first. Each manifest's id is set to its directory's name (a copied or
// renamed checkpoint reads its own files). Checks that every parent was
// written by the same shard (index and count) with the same routing as the
// checkpoint, and that the routing is one this build knows; not the data
// files (VerifyTableFiles) and not the shard that reads them.
absl::StatusOr<std::vector<v1::CheckpointManifest>> ReadChain(FileSystem* fs,
                                                              const std::string& path);

}  // namespace ember
