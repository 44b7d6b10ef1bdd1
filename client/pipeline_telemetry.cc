#include "client/pipeline_telemetry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ember {
namespace {
// Timeline threads of a pipeline's process (TraceTrack::thread).
constexpr uint32_t kTrainerThread = 0;
constexpr uint32_t kNetworkThread = 1;
constexpr uint32_t kFirstShardThread = 2;
}  // namespace

PipelineTelemetry::PipelineTelemetry(const Client& client, uint32_t worker_id, int staleness,
                                     TraceRecorder* trace, TrainerMetrics* metrics)
    : worker_id_(worker_id), trace_(trace) {
  if (trace_ != nullptr) {
    trace_->NameProcess(Track(0).process, absl::StrCat("worker ", worker_id_));
    trace_->NameTrack(Track(kTrainerThread), "trainer");
    trace_->NameTrack(Track(kNetworkThread), "network");
    for (uint32_t sh = 0; sh < client.shard_count(); ++sh) {
      trace_->NameTrack(Track(kFirstShardThread + sh), client.ShardName(sh));
    }
  }
  if (metrics != nullptr) {
    metrics_ = &metrics->ForWorker(worker_id_);
    metrics_->staleness_bound->Set(staleness < 0 ? -1 : staleness);
    metrics_->failed->Set(0);
  }
}

void PipelineTelemetry::Span(bool network, const char* name, absl::Time start, int64_t step,
                             std::string args) {
  if (trace_ == nullptr) return;
  if (!args.empty()) args += ",";
  absl::StrAppend(&args, "\"step\":", step);
  trace_->Record(Track(network ? kNetworkThread : kTrainerThread), name, start, absl::Now(),
                 std::move(args));
}

void PipelineTelemetry::SpanEnded(bool network, const char* name, absl::Time start, absl::Time end,
                                  int64_t step) {
  if (trace_ == nullptr) return;
  trace_->Record(Track(network ? kNetworkThread : kTrainerThread), name, start, end,
                 absl::StrCat("\"step\":", step));
}

void PipelineTelemetry::ExchangeSpans(absl::Time start, uint32_t shards, const int64_t* push_step,
                                      const int64_t* fetch_step, bool ok,
                                      const std::vector<ShardCall>& calls) {
  if (trace_ == nullptr) return;
  std::string args = absl::StrCat("\"shards\":", shards);
  if (push_step) absl::StrAppend(&args, ",\"push_step\":", *push_step);
  if (fetch_step) absl::StrAppend(&args, ",\"fetch_step\":", *fetch_step);
  absl::StrAppend(&args, ",\"ok\":", ok ? "true" : "false");
  trace_->Record(Track(kNetworkThread), "Exchange", start, absl::Now(), std::move(args));
  for (const ShardCall& c : calls) {
    trace_->Record(Track(kFirstShardThread + c.shard), "Exchange RPC", c.start, c.end,
                   absl::StrCat("\"attempt\":", c.attempt, ",\"code\":\"",
                                absl::StatusCodeToString(c.code), "\""));
  }
}

void PipelineTelemetry::Prefetched(uint64_t keys) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.keys += keys;
  }
  if (metrics_ != nullptr) metrics_->keys->Add(static_cast<double>(keys));
}

void PipelineTelemetry::Fetching(uint64_t unique_keys, uint64_t keys, int64_t staleness) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.unique_keys += unique_keys;
  }
  if (metrics_ == nullptr) return;
  metrics_->unique_keys->Add(static_cast<double>(unique_keys));
  if (keys > 0) {
    metrics_->unique_ratio->Set(static_cast<double>(unique_keys) / static_cast<double>(keys));
  }
  metrics_->staleness->Set(static_cast<double>(std::max<int64_t>(0, staleness)));
}

void PipelineTelemetry::Bytes(uint64_t sent, uint64_t received, uint64_t node_shuffle) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent += sent;
    stats_.bytes_received += received;
    stats_.exchange_bytes += node_shuffle;
  }
  if (metrics_ == nullptr) return;
  metrics_->bytes_sent->Add(static_cast<double>(sent));
  metrics_->bytes_received->Add(static_cast<double>(received));
  metrics_->bytes_node_shuffle->Add(static_cast<double>(node_shuffle));
}

void PipelineTelemetry::Waited(double waited, double fetch, bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.wait_seconds += waited;
    stats_.max_wait_seconds = std::max(stats_.max_wait_seconds, waited);
    ++stats_.steps_waited;
  }
  if (!ok || metrics_ == nullptr) return;
  metrics_->steps->Add();
  metrics_->exposed_wait->Observe(waited);
  metrics_->fetch->Observe(fetch);
  metrics_->overlap->Set(fetch > 0 ? std::clamp(1.0 - waited / fetch, 0.0, 1.0) : 1.0);
}

void PipelineTelemetry::Pushed(bool ok, uint64_t step_bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps_pushed;
  }
  if (!ok || metrics_ == nullptr) return;
  metrics_->pushes->Add();
  metrics_->step_bytes->Set(static_cast<double>(step_bytes));
}

void PipelineTelemetry::Failed() {
  if (metrics_ != nullptr) metrics_->failed->Set(1);
}

void PipelineTelemetry::Patched(uint64_t rows) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps_patched;
    stats_.rows_patched += rows;
  }
  if (metrics_ == nullptr) return;
  metrics_->steps_patched->Add();
  metrics_->rows_patched->Add(static_cast<double>(rows));
}

void PipelineTelemetry::Refetching() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps_refetched;
  }
  if (metrics_ != nullptr) metrics_->steps_refetched->Add();
}

void PipelineTelemetry::Refetched(uint64_t rows, uint64_t keys) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.rows_refetched += rows;
    stats_.keys_refetched += keys;
  }
  if (metrics_ != nullptr) metrics_->rows_refetched->Add(static_cast<double>(rows));
}

void PipelineTelemetry::Peeked(uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.patch_bytes += bytes;
  }
  if (metrics_ != nullptr) metrics_->patch_bytes->Add(static_cast<double>(bytes));
}

PipelineStats PipelineTelemetry::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace ember
