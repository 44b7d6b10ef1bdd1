// The C ABI of ember/ember_c.h over ember::Client and ember::StepPipeline.
//
// Longer than the library's other files on purpose: one function per symbol
// of ember_c.h, each a few lines of argument checks and status conversion
// around one C++ call, in the header's order, with the handles' structs
// private to this file; split, those structs would move into a header that
// only these pieces would include.
#include "ember/ember_c.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "c_api_transport.h"
#include "ember/client.h"
#include "pooling.h"
#include "ember/step_merger.h"
#include "ember/step_pipeline.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

struct ember_client {
  std::unique_ptr<ember::Client> client;
};

struct ember_pipeline {
  std::unique_ptr<ember::StepPipeline> pipeline;
  // The view of the step last waited for, so that a second wait for the
  // same step (a caller learning the batch size first) is answered again.
  std::optional<ember::StepView> view;
  // For ember_pipeline_prefetch_blocking: the next step to push, and whether
  // the pipeline is closing, under mu.
  std::mutex mu;
  std::condition_variable pushed;
  int64_t next_push ABSL_GUARDED_BY(mu) = 0;
  bool closing ABSL_GUARDED_BY(mu) = false;
  // Staged batches by ticket (ember_pipeline_stage), and the tickets
  // claimed or prefetched ahead by step, not yet pushed; under stage_mu.
  std::mutex stage_mu;
  int64_t next_ticket ABSL_GUARDED_BY(stage_mu) = 0;
  std::map<int64_t, ember::Batch> staged ABSL_GUARDED_BY(stage_mu);
  std::map<int64_t, int64_t> ticket_step ABSL_GUARDED_BY(stage_mu);
  int64_t next_prefetch ABSL_GUARDED_BY(stage_mu) = 0;
  std::condition_variable staged_cv;  // a batch was staged
  ember_merger* merger = nullptr;     // the merged ranks' shared decisions
  int merger_rank = 0;
  // The step the newest staged batch would get (next_prefetch + staged
  // batches - 1), for the other merged ranks to read without this lock.
  std::atomic<int64_t> staged_upto{0};
  // Set by the first stage: a pipeline fed by prefetch calls alone never
  // pays the staging's lock and bookkeeping on its pushes.
  std::atomic<bool> staging{false};
};

struct ember_merger {
  std::unique_ptr<ember::StepMerger> merger;
  // Staged pipelines (ember_pipeline_stage) of the ranks: how far each
  // point of the training sequence (a claim or a push of step t) prefetches,
  // decided by the first rank there from its staged batches, so that every
  // rank makes the same Prefetch calls at the same points, whenever its
  // input pipeline staged them (the merger needs the same calls in the
  // same order; a rank's staging runs on the input pipeline's thread).
  std::mutex mu;
  std::map<std::pair<int, int64_t>, int64_t> prefetch_upto ABSL_GUARDED_BY(mu);
  std::vector<ember_pipeline*> ranks ABSL_GUARDED_BY(mu);  // null until made, after freed
};

namespace {

thread_local std::string last_error;

// How long a merged rank's push waits for its input pipeline to stage the
// batch the other ranks prefetch at that point.
constexpr double kStagedWaitSeconds = 600;

int Fail(const absl::Status& status) {
  last_error = std::string(status.message());
  return static_cast<int>(status.code());
}

}  // namespace

int ember::c_abi::Fail(const absl::Status& status) { return ::Fail(status); }

namespace {

int Report(const absl::Status& status) {
  if (status.ok()) return 0;
  return Fail(status);
}

int InvalidArgument(const std::string& message) {
  return Fail(absl::InvalidArgumentError(message));
}

char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(out, s.data(), s.size() + 1);
  return out;
}

absl::Duration Seconds(double s, absl::Duration otherwise) {
  return s > 0 ? absl::Seconds(s) : otherwise;
}

// Messages to JSON with proto field names, so that Python reads the names it
// would find in the .proto.
template <typename Message>
absl::Status AppendJson(const Message& message, std::string* out) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return absl::InternalError(std::string(status.message()));
  out->append(json);
  return absl::OkStatus();
}

template <typename Message>
absl::Status JsonArray(const std::vector<Message>& messages, std::string* out) {
  out->push_back('[');
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i > 0) out->push_back(',');
    if (auto s = AppendJson(messages[i], out); !s.ok()) return s;
  }
  out->push_back(']');
  return absl::OkStatus();
}

absl::Status ToCombiner(int combiner, ember::Combiner* out) {
  switch (combiner) {
    case EMBER_COMBINER_SUM: *out = ember::Combiner::kSum; return absl::OkStatus();
    case EMBER_COMBINER_MEAN: *out = ember::Combiner::kMean; return absl::OkStatus();
    case EMBER_COMBINER_SQRTN: *out = ember::Combiner::kSqrtN; return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "combiner ", combiner, "; expected 0 (sum), 1 (mean) or 2 (sqrtn)"));
}

// The shape checks of ember_pool_forward / _backward.
absl::Status CheckPooling(const int64_t* offsets, size_t num_offsets, const uint32_t* inverse,
                          size_t num_ids, size_t num_rows) {
  if (num_offsets == 0 || offsets[0] != 0) {
    return absl::InvalidArgumentError("pooling: offsets must start with 0 (batch + 1 entries)");
  }
  for (size_t i = 1; i < num_offsets; ++i) {
    if (offsets[i] < offsets[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("pooling: offsets[", i, "] = ", offsets[i],
                                                     " < offsets[", i - 1, "] = ", offsets[i - 1]));
    }
  }
  if (static_cast<uint64_t>(offsets[num_offsets - 1]) != num_ids) {
    return absl::InvalidArgumentError(absl::StrCat("pooling: offsets end at ",
                                                   offsets[num_offsets - 1], "; expected ",
                                                   num_ids, " (one per id)"));
  }
  for (size_t j = 0; j < num_ids; ++j) {
    if (inverse[j] >= num_rows) {
      return absl::InvalidArgumentError(absl::StrCat("pooling: inverse[", j, "] = ", inverse[j],
                                                     "; expected < ", num_rows, " (rows)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

extern "C" {

const char* ember_last_error(void) { return last_error.c_str(); }

void ember_free_string(char* s) { std::free(s); }

int ember_client_connect(const ember_client_options* options, ember_client** out) {
  if (options == nullptr || out == nullptr) return InvalidArgument("options and out are required");
  if (options->num_shards > 0 && options->shards == nullptr) {
    return InvalidArgument(absl::StrCat("shards: null, expected ", options->num_shards, " addresses"));
  }
  ember::ClientOptions client_options;
  for (size_t i = 0; i < options->num_shards; ++i) {
    if (options->shards[i] == nullptr) return InvalidArgument(absl::StrCat("shards[", i, "] is null"));
    client_options.shards.emplace_back(options->shards[i]);
  }
  client_options.rpc_timeout = Seconds(options->rpc_timeout_s, client_options.rpc_timeout);
  client_options.connect_timeout = Seconds(options->connect_timeout_s, client_options.connect_timeout);
  if (options->retry_budget_s >= 0) client_options.retry_budget = absl::Seconds(options->retry_budget_s);
  auto text = [](const char* s) { return s == nullptr ? std::string() : std::string(s); };
  client_options.tls.enabled = options->tls_enabled != 0;
  client_options.tls.ca_file = text(options->tls_ca_file);
  client_options.tls.cert_file = text(options->tls_cert_file);
  client_options.tls.key_file = text(options->tls_key_file);
  client_options.tls.server_name = text(options->tls_server_name);
  client_options.auth_token = text(options->auth_token);
  client_options.in_process.checkpoint_dir = text(options->inproc_checkpoint_dir);
  client_options.in_process.restore_from = text(options->inproc_restore_from);
  auto client = ember::Client::Connect(client_options);
  if (!client.ok()) return Fail(client.status());
  *out = new ember_client{std::move(*client)};
  return 0;
}

void ember_client_free(ember_client* client) { delete client; }

uint32_t ember_client_shard_count(const ember_client* client) {
  return client->client->shard_count();
}

int ember_client_create_table(ember_client* client, const char* config_json) {
  ember::v1::TableConfig config;
  const auto parsed = google::protobuf::util::JsonStringToMessage(config_json, &config);
  if (!parsed.ok()) {
    return InvalidArgument(absl::StrCat("table config: not an ember.v1.TableConfig in JSON: ",
                                        parsed.message().as_string()));
  }
  return Report(client->client->CreateTable(config));
}

int ember_client_list_tables(ember_client* client, char** out_json) {
  auto tables = client->client->ListTables();
  if (!tables.ok()) return Fail(tables.status());
  std::string json;
  if (auto s = JsonArray(*tables, &json); !s.ok()) return Fail(s);
  *out_json = CopyString(json);
  return 0;
}

int ember_client_shard_infos(ember_client* client, char** out_json) {
  auto infos = client->client->ShardInfos();
  if (!infos.ok()) return Fail(infos.status());
  std::string json;
  if (auto s = JsonArray(*infos, &json); !s.ok()) return Fail(s);
  *out_json = CopyString(json);
  return 0;
}

int ember_client_stored_rows(ember_client* client, const char* table, uint64_t* out) {
  auto rows = client->client->StoredRows(table);
  if (!rows.ok()) return Fail(rows.status());
  *out = *rows;
  return 0;
}

int ember_client_lookup_rows(ember_client* client, const char* table, const uint64_t* keys,
                             size_t num_keys, int read_only, float* out, size_t out_len) {
  auto rows = client->client->LookupRows(table, absl::MakeConstSpan(keys, num_keys), read_only != 0);
  if (!rows.ok()) return Fail(rows.status());
  if (rows->size() != out_len) {
    return InvalidArgument(absl::StrCat("table '", table, "': out has ", out_len,
                                        " floats; expected ", rows->size(), " (", num_keys,
                                        " keys x dim)"));
  }
  if (out_len > 0) std::memcpy(out, rows->data(), out_len * sizeof(float));
  return 0;
}

int ember_client_checkpoint(ember_client* client, const char* options_json, char** out_json) {
  // The options as a protobuf Struct: JSON parsing without another library.
  google::protobuf::Struct fields;
  if (options_json != nullptr && options_json[0] != '\0') {
    const auto parsed = google::protobuf::util::JsonStringToMessage(options_json, &fields);
    if (!parsed.ok()) {
      return InvalidArgument(absl::StrCat("checkpoint options: not a JSON object: ",
                                          parsed.message().as_string()));
    }
  }
  ember::CheckpointOptions options;
  for (const auto& [name, value] : fields.fields()) {
    if (name == "id" && value.has_string_value()) {
      options.id = value.string_value();
    } else if (name == "step" && value.has_number_value()) {
      options.step = static_cast<int64_t>(value.number_value());
    } else if (name == "incremental" && value.has_bool_value()) {
      options.incremental = value.bool_value();
    } else if (name == "timeout_s" && value.has_number_value()) {
      options.timeout = absl::Seconds(value.number_value());
    } else {
      return InvalidArgument(absl::StrCat(
          "checkpoint options: unknown field '", name,
          "' or wrong type; expected id (string), step (int), incremental (bool), timeout_s (number)"));
    }
  }
  auto result = client->client->Checkpoint(options);
  if (!result.ok()) return Fail(result.status());
  std::string json = absl::StrCat("{\"step\":", result->step, ",\"id\":\"", result->id, "\",\"shards\":");
  if (auto s = JsonArray(result->shards, &json); !s.ok()) return Fail(s);
  json.push_back('}');
  *out_json = CopyString(json);
  return 0;
}

int ember_pipeline_create(ember_client* client, const ember_pipeline_options* options,
                          ember_pipeline** out) {
  if (client == nullptr || options == nullptr || out == nullptr) {
    return InvalidArgument("client, options and out are required");
  }
  ember::PipelineOptions pipeline_options;
  pipeline_options.worker_id = options->worker_id;
  pipeline_options.staleness = options->staleness;
  pipeline_options.prefetch_depth = options->prefetch_depth;
  pipeline_options.first_step = options->first_step;
  pipeline_options.early_fetch = options->no_early_fetch == 0;
  if (options->merger != nullptr) {
    pipeline_options.merger = options->merger->merger.get();
    pipeline_options.merger_rank = options->merger_rank;
  }
  if (options->node_transport != nullptr) {
    pipeline_options.node_transport = ember::c_abi::TransportOf(options->node_transport);
  }
  pipeline_options.node_one_worker = options->node_one_worker != 0;
  for (size_t f = 0; f < options->num_features; ++f) {
    const ember_feature_spec& spec = options->features[f];
    if (spec.name == nullptr || spec.table == nullptr) {
      return InvalidArgument(absl::StrCat("features[", f, "]: name and table are required"));
    }
    ember::FeatureSpec feature{spec.name, spec.table, ember::Combiner::kSum};
    if (auto s = ToCombiner(spec.combiner, &feature.combiner); !s.ok()) {
      return InvalidArgument(absl::StrCat("feature '", spec.name, "': ", s.message()));
    }
    pipeline_options.features.push_back(std::move(feature));
  }
  auto pipeline = ember::StepPipeline::Create(client->client.get(), std::move(pipeline_options));
  if (!pipeline.ok()) return Fail(pipeline.status());
  *out = new ember_pipeline;
  (*out)->pipeline = std::move(*pipeline);
  (*out)->next_push = options->first_step;
  (*out)->merger = options->merger;
  (*out)->merger_rank = options->merger_rank;
  (*out)->staged_upto = options->first_step - 1;
  if (ember_merger* m = options->merger; m != nullptr) {
    std::lock_guard<std::mutex> lock(m->mu);
    if (m->ranks.size() <= static_cast<size_t>(options->merger_rank)) {
      m->ranks.resize(options->merger_rank + 1, nullptr);
    }
    m->ranks[options->merger_rank] = *out;
  }
  (*out)->next_ticket = options->first_step;
  (*out)->next_prefetch = options->first_step;
  return 0;
}

int ember_merger_create(ember_client* client, const ember_merger_options* options,
                        ember_merger** out) {
  if (client == nullptr || options == nullptr || out == nullptr) {
    return InvalidArgument("client, options and out are required");
  }
  ember::StepMergerOptions merger_options;
  merger_options.ranks = options->ranks;
  merger_options.worker_id = options->worker_id;
  merger_options.staleness = options->staleness;
  merger_options.first_step = options->first_step;
  if (options->timeout_s > 0) merger_options.timeout = absl::Seconds(options->timeout_s);
  merger_options.early_fetch = options->no_early_fetch == 0;
  auto merger = ember::StepMerger::Create(client->client.get(), merger_options);
  if (!merger.ok()) return Fail(merger.status());
  *out = new ember_merger;
  (*out)->merger = std::move(*merger);
  return 0;
}

void ember_merger_free(ember_merger* merger) { delete merger; }

void ember_merger_stats_get(const ember_merger* merger, ember_merger_stats* out) {
  const ember::StepMergerStats stats = merger->merger->Stats();
  out->rounds = stats.rounds;
  out->fetch_rounds = stats.fetch_rounds;
  out->rank_keys = stats.rank_keys;
  out->merged_keys = stats.merged_keys;
}

namespace {

void MarkClosing(ember_pipeline* pipeline) {
  {
    std::lock_guard<std::mutex> lock(pipeline->mu);
    pipeline->closing = true;
  }
  pipeline->pushed.notify_all();
}

}  // namespace

void ember_pipeline_free(ember_pipeline* pipeline) {
  if (pipeline == nullptr) return;
  if (ember_merger* m = pipeline->merger; m != nullptr) {
    std::lock_guard<std::mutex> lock(m->mu);
    m->ranks[pipeline->merger_rank] = nullptr;
  }
  MarkClosing(pipeline);
  delete pipeline;
}

size_t ember_pipeline_num_features(const ember_pipeline* pipeline) {
  return pipeline->pipeline->num_features();
}

uint32_t ember_pipeline_dim(const ember_pipeline* pipeline, size_t feature) {
  return feature < pipeline->pipeline->num_features() ? pipeline->pipeline->dim(feature) : 0;
}

int ember_pipeline_prefetch_depth(const ember_pipeline* pipeline) {
  return pipeline->pipeline->prefetch_depth();
}

namespace {

// Waits until `step` fits in the prefetch depth, i.e. until step - depth - 1
// has been pushed (see ember_pipeline_prefetch_blocking).
int AwaitDepth(ember_pipeline* pipeline, int64_t step, double timeout_s, const int* cancel) {
  const int64_t depth = pipeline->pipeline->prefetch_depth();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(timeout_s, 0.0)));
  std::unique_lock<std::mutex> lock(pipeline->mu);
  // Wakes on every push; polls `cancel` (set by another thread without
  // this lock) every 5 ms.
  for (;;) {
    if (pipeline->closing) {
      return Fail(absl::CancelledError(absl::StrCat("prefetch of step ", step, ": the pipeline is closed")));
    }
    if (cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_ACQUIRE) != 0) {
      return Fail(absl::CancelledError(absl::StrCat("prefetch of step ", step, ": cancelled")));
    }
    if (step - pipeline->next_push <= depth) return 0;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          "prefetch of step ", step, ": step ", step - depth - 1, " was not pushed within ",
          timeout_s, " s (prefetch depth ", depth, ")")));
    }
    pipeline->pushed.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(5)));
  }
}

}  // namespace

int ember_pipeline_prefetch_blocking(ember_pipeline* pipeline, int64_t step,
                                     const ember_feature_batch* features, size_t num_features,
                                     double timeout_s, const int* cancel) {
  if (int code = AwaitDepth(pipeline, step, timeout_s, cancel); code != 0) return code;
  return ember_pipeline_prefetch(pipeline, step, features, num_features);
}

namespace {

ember::Batch CopyBatch(const ember_feature_batch* features, size_t num_features) {
  ember::Batch batch;
  batch.features.resize(num_features);
  for (size_t f = 0; f < num_features; ++f) {
    const ember_feature_batch& in = features[f];
    ember::FeatureBatch& fb = batch.features[f];
    fb.offsets.assign(in.offsets, in.offsets + in.num_offsets);
    fb.keys.assign(in.keys, in.keys + in.num_keys);
    if (in.weights != nullptr) fb.weights.assign(in.weights, in.weights + in.num_weights);
  }
  return batch;
}

int64_t NextPush(ember_pipeline* pipeline) {
  std::lock_guard<std::mutex> lock(pipeline->mu);
  return pipeline->next_push;
}

// The points of a training sequence where staged batches are prefetched.
enum class Point { kClaim, kPush };

// At `point` of step `step`: prefetches staged tickets in order as far as
// the depth allows and the batches are staged. A merged rank prefetches as
// far as the first rank at this point decided, waiting (up to timeout_s)
// for its input pipeline to stage the batches it lacks. A batch the
// pipeline refuses (a malformed one) fails the claim or push that reached
// it, naming its ticket.
int PrefetchStaged(ember_pipeline* pipeline, std::unique_lock<std::mutex>& lock, Point point,
                   int64_t step, double timeout_s) {
  const int64_t depth = pipeline->pipeline->prefetch_depth();
  int64_t upto = std::min<int64_t>(pipeline->next_prefetch + pipeline->staged.size(),
                                   NextPush(pipeline) + depth + 1) - 1;
  if (ember_merger* m = pipeline->merger; m != nullptr) {
    std::lock_guard<std::mutex> decisions(m->mu);
    auto [it, first] = m->prefetch_upto.try_emplace({static_cast<int>(point), step}, upto);
    if (first) {
      // As far as every rank has staged: no rank waits for its input
      // pipeline (which may itself wait for the step to end).
      for (const ember_pipeline* rank : m->ranks) {
        if (rank != nullptr) it->second = std::min(it->second, rank->staged_upto.load());
      }
    }
    upto = it->second;
    if (first) {
      // The ranks are within a few steps of each other: older points are done.
      m->prefetch_upto.erase(m->prefetch_upto.begin(),
                             m->prefetch_upto.lower_bound({0, step - 64}));
    }
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(timeout_s, 0.0)));
  while (pipeline->next_prefetch <= upto) {
    if (pipeline->staged.empty()) {
      if (!pipeline->staged_cv.wait_until(lock, deadline,
                                          [&] { return !pipeline->staged.empty(); })) {
        return Fail(absl::DeadlineExceededError(absl::StrCat(
            "prefetch of step ", pipeline->next_prefetch, ": the other ranks staged it, this "
            "rank's input pipeline did not within ", timeout_s, " s (each rank's input must "
            "hold the same number of batches)")));
      }
      continue;
    }
    auto it = pipeline->staged.begin();
    const int64_t next = pipeline->next_prefetch;
    const int64_t ticket = it->first;
    absl::Status prefetched = pipeline->pipeline->Prefetch(next, std::move(it->second));
    pipeline->staged.erase(it);
    if (!prefetched.ok()) {
      return Fail(absl::Status(prefetched.code(), absl::StrCat("the batch staged as ticket ",
                                                               ticket, ": ", prefetched.message())));
    }
    pipeline->ticket_step[ticket] = next;
    pipeline->next_prefetch = next + 1;
  }
  return 0;
}

// Under stage_mu, after staged or next_prefetch changed.
void PublishStaged(ember_pipeline* pipeline) {
  pipeline->staged_upto =
      pipeline->next_prefetch + static_cast<int64_t>(pipeline->staged.size()) - 1;
}

}  // namespace

int ember_pipeline_prefetch(ember_pipeline* pipeline, int64_t step,
                            const ember_feature_batch* features, size_t num_features) {
  return Report(pipeline->pipeline->Prefetch(step, CopyBatch(features, num_features)));
}

int ember_pipeline_stage(ember_pipeline* pipeline, const ember_feature_batch* features,
                         size_t num_features, int64_t* ticket) {
  ember::Batch batch = CopyBatch(features, num_features);
  {
    std::lock_guard<std::mutex> lock(pipeline->stage_mu);
    *ticket = pipeline->next_ticket++;
    pipeline->staged.emplace(*ticket, std::move(batch));
    PublishStaged(pipeline);
  }
  pipeline->staging = true;
  pipeline->staged_cv.notify_all();
  return 0;
}

int ember_pipeline_ticket_step(ember_pipeline* pipeline, int64_t ticket, int64_t* step) {
  std::lock_guard<std::mutex> lock(pipeline->stage_mu);
  auto it = pipeline->ticket_step.find(ticket);
  if (it == pipeline->ticket_step.end()) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "ticket ", ticket, ": not claimed on this pipeline (push a ticket after its lookup, once)")));
  }
  *step = it->second;
  return 0;
}

int ember_pipeline_claim(ember_pipeline* pipeline, int64_t ticket, double timeout_s,
                         int64_t* step) {
  // Held throughout (but while waiting for a batch to be staged): claims
  // and pushes come from the training thread, and the push that frees the
  // depth takes this lock only after it counted.
  std::unique_lock<std::mutex> lock(pipeline->stage_mu);
  if (auto it = pipeline->ticket_step.find(ticket); it != pipeline->ticket_step.end()) {
    *step = it->second;
    return PrefetchStaged(pipeline, lock, Point::kClaim, *step, timeout_s);
  }
  // Older staged tickets were drawn and never trained (a dropped iterator).
  pipeline->staged.erase(pipeline->staged.begin(), pipeline->staged.lower_bound(ticket));
  PublishStaged(pipeline);
  if (!pipeline->ticket_step.empty() && pipeline->ticket_step.begin()->first < ticket) {
    const auto& [old_ticket, old_step] = *pipeline->ticket_step.begin();
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "claim of ticket ", ticket, ": step ", old_step, " was prefetched for ticket ", old_ticket,
        ", whose element was never trained (its iterator was dropped after its rows were "
        "fetched); train every element drawn, in order")));
  }
  auto it = pipeline->staged.find(ticket);
  if (it == pipeline->staged.end()) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "claim of ticket ", ticket, ": not staged on this pipeline, or pushed already: prefetch it "
        "first (a ticket from this pipeline's stage, e.g. ember.tf's layer.prefetch)")));
  }
  const int64_t claimed = pipeline->next_prefetch;
  if (int code = AwaitDepth(pipeline, claimed, timeout_s, nullptr); code != 0) return code;
  absl::Status prefetched = pipeline->pipeline->Prefetch(claimed, std::move(it->second));
  pipeline->staged.erase(it);
  if (!prefetched.ok()) return Fail(prefetched);
  pipeline->ticket_step[ticket] = claimed;
  pipeline->next_prefetch = claimed + 1;
  *step = claimed;
  return PrefetchStaged(pipeline, lock, Point::kClaim, claimed, timeout_s);
}

namespace {

// The step's view, waited for once and kept until its push.
absl::StatusOr<const ember::StepView*> StepViewOf(ember_pipeline* pipeline, int64_t step) {
  if (!pipeline->view.has_value() || pipeline->view->step != step) {
    auto view = pipeline->pipeline->Wait(step);
    if (!view.ok()) return view.status();
    pipeline->view = std::move(*view);
  }
  return &*pipeline->view;
}

size_t PackedWidth(const ember::StepPipeline& pipeline) {
  size_t width = 0;
  for (size_t f = 0; f < pipeline.num_features(); ++f) width += pipeline.dim(f);
  return width;
}

}  // namespace

int ember_pipeline_wait(ember_pipeline* pipeline, int64_t step, int64_t* batch_size,
                        float* const* out, const size_t* out_lens, size_t num_out) {
  auto waited = StepViewOf(pipeline, step);
  if (!waited.ok()) return Fail(waited.status());
  const ember::StepView& view = **waited;
  if (batch_size != nullptr) *batch_size = view.batch_size;
  if (out == nullptr) return 0;
  if (num_out != view.pooled.size()) {
    return InvalidArgument(absl::StrCat("wait(step ", step, "): ", num_out,
                                        " output buffers; expected one per feature (",
                                        view.pooled.size(), ")"));
  }
  for (size_t f = 0; f < num_out; ++f) {
    if (out_lens[f] != view.pooled[f].size()) {
      return InvalidArgument(absl::StrCat("wait(step ", step, "): output ", f, " has ", out_lens[f],
                                          " floats; expected ", view.pooled[f].size(), " (",
                                          view.batch_size, " x ", pipeline->pipeline->dim(f), ")"));
    }
  }
  for (size_t f = 0; f < num_out; ++f) {
    if (out_lens[f] > 0) std::memcpy(out[f], view.pooled[f].data(), out_lens[f] * sizeof(float));
  }
  return 0;
}

int ember_pipeline_wait_packed(ember_pipeline* pipeline, int64_t step, int64_t* batch_size,
                               float* out, size_t len) {
  auto waited = StepViewOf(pipeline, step);
  if (!waited.ok()) return Fail(waited.status());
  const ember::StepView& view = **waited;
  if (batch_size != nullptr) *batch_size = view.batch_size;
  if (out == nullptr) return 0;
  const size_t width = PackedWidth(*pipeline->pipeline);
  const size_t batch = static_cast<size_t>(view.batch_size);
  if (len != batch * width) {
    return InvalidArgument(absl::StrCat("wait(step ", step, "): packed output has ", len,
                                        " floats; expected ", batch * width, " (", batch, " x ",
                                        width, ", the sum of the features' dims)"));
  }
  size_t column = 0;
  for (size_t f = 0; f < view.pooled.size(); ++f) {
    const size_t dim = pipeline->pipeline->dim(f);
    const float* src = view.pooled[f].data();
    for (size_t i = 0; i < batch; ++i) {
      std::memcpy(out + i * width + column, src + i * dim, dim * sizeof(float));
    }
    column += dim;
  }
  return 0;
}

int ember_pipeline_push_packed(ember_pipeline* pipeline, int64_t step, const float* d_pooled,
                               size_t len) {
  const size_t n = pipeline->pipeline->num_features();
  const size_t width = PackedWidth(*pipeline->pipeline);
  if (width == 0 || len % width != 0) {
    return InvalidArgument(absl::StrCat("push(step ", step, "): packed gradients have ", len,
                                        " floats; expected batch x ", width,
                                        " (the sum of the features' dims)"));
  }
  const size_t batch = len / width;
  std::vector<std::vector<float>> grads(n);
  std::vector<const float*> ptrs(n);
  std::vector<size_t> lens(n);
  size_t column = 0;
  for (size_t f = 0; f < n; ++f) {
    const size_t dim = pipeline->pipeline->dim(f);
    grads[f].resize(batch * dim);
    for (size_t i = 0; i < batch; ++i) {
      std::memcpy(grads[f].data() + i * dim, d_pooled + i * width + column, dim * sizeof(float));
    }
    column += dim;
    ptrs[f] = grads[f].data();
    lens[f] = grads[f].size();
  }
  return ember_pipeline_push(pipeline, step, ptrs.data(), lens.data(), n);
}

int ember_pipeline_push(ember_pipeline* pipeline, int64_t step, const float* const* d_pooled,
                        const size_t* lens, size_t num) {
  std::vector<absl::Span<const float>> grads;
  grads.reserve(num);
  for (size_t f = 0; f < num; ++f) grads.emplace_back(d_pooled[f], lens[f]);
  const absl::Status status = pipeline->pipeline->Push(step, grads);
  if (status.ok()) {
    if (pipeline->view.has_value() && pipeline->view->step == step) pipeline->view.reset();
    {
      std::lock_guard<std::mutex> lock(pipeline->mu);
      pipeline->next_push = step + 1;
    }
    pipeline->pushed.notify_all();
    // A push precedes nothing staged unless its step was claimed, which
    // needs a stage first.
    if (!pipeline->staging) return 0;
    std::unique_lock<std::mutex> lock(pipeline->stage_mu);
    for (auto it = pipeline->ticket_step.begin(); it != pipeline->ticket_step.end();) {
      it = it->second <= step ? pipeline->ticket_step.erase(it) : std::next(it);
    }
    // Staged batches (a tf.data input) go out after the push, as a trainer
    // that prefetches step t + depth after pushing step t would.
    return PrefetchStaged(pipeline, lock, Point::kPush, step, kStagedWaitSeconds);
  }
  return Report(status);
}

int ember_pipeline_flush(ember_pipeline* pipeline) { return Report(pipeline->pipeline->Flush()); }

int ember_pipeline_close(ember_pipeline* pipeline) {
  MarkClosing(pipeline);
  return Report(pipeline->pipeline->Close());
}

void ember_pipeline_stats_get(const ember_pipeline* pipeline, ember_pipeline_stats* out) {
  const ember::PipelineStats stats = pipeline->pipeline->Stats();
  out->steps_waited = stats.steps_waited;
  out->steps_pushed = stats.steps_pushed;
  out->wait_seconds = stats.wait_seconds;
  out->max_wait_seconds = stats.max_wait_seconds;
  out->keys = stats.keys;
  out->unique_keys = stats.unique_keys;
  out->bytes_sent = stats.bytes_sent;
  out->bytes_received = stats.bytes_received;
  out->steps_patched = stats.steps_patched;
  out->rows_patched = stats.rows_patched;
  out->patch_bytes = stats.patch_bytes;
  out->steps_refetched = stats.steps_refetched;
  out->rows_refetched = stats.rows_refetched;
  out->keys_refetched = stats.keys_refetched;
}

int ember_pool_forward(const int64_t* offsets, size_t num_offsets, const uint32_t* inverse,
                       size_t num_ids, const float* weights, int combiner, const float* rows,
                       size_t num_rows, uint32_t dim, float* pooled) {
  ember::Combiner c;
  if (auto s = ToCombiner(combiner, &c); !s.ok()) return Fail(s);
  if (auto s = CheckPooling(offsets, num_offsets, inverse, num_ids, num_rows); !s.ok()) return Fail(s);
  ember::PoolForward(absl::MakeConstSpan(offsets, num_offsets), absl::MakeConstSpan(inverse, num_ids),
                     absl::MakeConstSpan(weights, weights == nullptr ? 0 : num_ids), c, rows, dim,
                     pooled);
  return 0;
}

int ember_pool_backward(const int64_t* offsets, size_t num_offsets, const uint32_t* inverse,
                        size_t num_ids, const float* weights, int combiner, const float* d_pooled,
                        size_t num_rows, uint32_t dim, float* d_rows) {
  ember::Combiner c;
  if (auto s = ToCombiner(combiner, &c); !s.ok()) return Fail(s);
  if (auto s = CheckPooling(offsets, num_offsets, inverse, num_ids, num_rows); !s.ok()) return Fail(s);
  if (num_rows > 0) std::memset(d_rows, 0, num_rows * dim * sizeof(float));
  ember::PoolBackward(absl::MakeConstSpan(offsets, num_offsets), absl::MakeConstSpan(inverse, num_ids),
                      absl::MakeConstSpan(weights, weights == nullptr ? 0 : num_ids), c, d_pooled,
                      dim, d_rows);
  return 0;
}

}  // extern "C"
