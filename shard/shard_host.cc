#include "shard/shard_host.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"
#include "shard/shard_gauges.h"
#include "spdlog/spdlog.h"

namespace ember {
namespace {

absl::Status CreateConfiguredTables(const std::string& path, Shard* shard) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("table_config_file '", path, "': cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  v1::TableConfigList list;
  if (!google::protobuf::TextFormat::ParseFromString(text.str(), &list)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table_config_file '", path, "': not a text-format ember.v1.TableConfigList"));
  }
  for (const v1::TableConfig& config : list.tables()) {
    v1::CreateTableResponse response;
    absl::Status s = shard->CreateTable(config, &response);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("table_config_file '", path, "': ", s.message()));
    }
    spdlog::info("created table '{}' dim {} from {}", config.name(), config.dim(), path);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardHostOptions::Validate() const {
  EMBER_RETURN_IF_ERROR(checkpoint.Validate());
  if (restore_from == "latest" && checkpoint.directory.empty()) {
    return absl::InvalidArgumentError(
        "restore_from: 'latest' needs a checkpoint_dir, received none");
  }
  return shard.Validate();
}

absl::StatusOr<std::unique_ptr<ShardHost>> ShardHost::Start(const ShardHostOptions& options,
                                                            metrics::Registry* registry) {
  EMBER_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<ShardHost> host(new ShardHost());
  host->shard_ = std::make_unique<Shard>(options.shard);
  if (registry != nullptr) {
    host->metrics_ = std::make_unique<ShardMetrics>(registry);
    host->shard_->SetMetrics(host->metrics_.get());
    WatchShardGauges(host->shard_.get(), host->metrics_.get());
  }
  host->checkpointer_ = std::make_unique<Checkpointer>(host->shard_.get(), options.checkpoint,
                                                       FileSystem::Posix(), host->metrics_.get());
  if (!options.restore_from.empty()) {
    EMBER_RETURN_IF_ERROR(host->checkpointer_->Restore(options.restore_from).status());
  }
  if (!options.table_config_file.empty()) {
    EMBER_RETURN_IF_ERROR(CreateConfiguredTables(options.table_config_file, host->shard_.get()));
  }
  host->checkpointer_->StartPeriodic();
  host->maintenance_ = std::thread([h = host.get()] {
    const absl::Time start = absl::Now();
    std::unique_lock<std::mutex> lock(h->maintenance_mu_);
    while (
        !h->maintenance_cv_.wait_for(lock, std::chrono::seconds(1), [h] { return h->stopping_; })) {
      lock.unlock();
      if (const uint64_t n = h->shard_->ExpireRows(absl::Now() - start); n > 0) {
        spdlog::info("TTL: {} rows expired", n);
      }
      lock.lock();
    }
  });
  return host;
}

ShardHost::~ShardHost() { Stop(); }

void ShardHost::Stop() {
  if (checkpointer_) checkpointer_->StopPeriodic();
  std::call_once(stopped_, [this] {
    {
      std::lock_guard<std::mutex> lock(maintenance_mu_);
      stopping_ = true;
    }
    maintenance_cv_.notify_all();
    if (maintenance_.joinable()) maintenance_.join();
  });
}

absl::StatusOr<std::vector<StoreDevice>> ParseShardDevices(const std::string& text,
                                                           absl::string_view field) {
  std::vector<StoreDevice> devices;
  for (absl::string_view one : absl::StrSplit(text, ',')) {
    absl::StatusOr<StoreDevice> parsed = ParseStoreDevice(one);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", parsed.status().message()));
    }
    devices.push_back(*parsed);
  }
  return devices;
}

}  // namespace ember
