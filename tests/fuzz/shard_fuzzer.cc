// Fuzzes the Shard core with sequences of requests: raw protos parsed from
// the input (request validation of anything a client can send) and requests
// built from the input over real tables (the store paths behind validation).
//
// Checked besides memory safety and undefined behaviour (ASan, UBSan):
// - a refused Lookup, Push or CreateTable changes nothing: the shard's tables
//   and their row counts are the same before and after;
// - an accepted Lookup answers one row of `dim` values of its dtype per key, and an
//   accepted Push names every table it was given.
// Pushes come with their gradients in the message or, as an exchange stream
// hands them over, left in pieces cut anywhere (ReceivedExchange).
#include <fuzzer/FuzzedDataProvider.h>
#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/key_router.h"
#include "common/wire.h"
#include "google/protobuf/stubs/logging.h"
#include "server/received_exchange.h"
#include "shard/shard.h"
#include "tests/fuzz/fuzz_tables.h"

namespace ember::fuzz {
namespace {

constexpr uint32_t kShards = 2;
constexpr size_t kMaxOps = 24;
constexpr size_t kMaxKeys = 48;

// Keys this shard (index 0 of 2) owns, so that built requests pass routing.
const std::vector<uint64_t>& OwnedKeys() {
  static const std::vector<uint64_t> keys = [] {
    std::vector<uint64_t> k;
    for (uint64_t key = 0; k.size() < 256; ++key) {
      if (DefaultShardOf(key, kShards) == 0) k.push_back(key);
    }
    return k;
  }();
  return keys;
}

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  fprintf(stderr, "shard_fuzzer: %s: %s\n", what, detail.c_str());
  abort();
}

// The shard's visible state: table names with their row counts.
std::string Fingerprint(const Shard& shard) {
  v1::ListTablesResponse list;
  shard.ListTables(&list);
  std::string out;
  for (const auto& t : list.tables()) {
    out += t.config().name() + ":" + std::to_string(t.rows()) + ";";
  }
  return out;
}

std::string TableName(FuzzedDataProvider& in) {
  static const char* kNames[] = {"a", "b", "c", "w", "missing", ""};
  return kNames[in.ConsumeIntegralInRange<size_t>(0, 5)];
}

uint32_t DimOf(const std::string& table) {
  if (table == "a") return 4;
  if (table == "b") return 3;
  if (table == "w") return 128;
  return 1;
}

std::vector<uint64_t> Keys(FuzzedDataProvider& in) {
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, kMaxKeys);
  std::vector<uint64_t> keys;
  for (size_t i = 0; i < n && in.remaining_bytes() > 0; ++i) {
    // Mostly keys this shard owns (with repeats); now and then any key.
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
      keys.push_back(in.ConsumeIntegral<uint64_t>());
    } else {
      keys.push_back(OwnedKeys()[in.ConsumeIntegralInRange<size_t>(0, 31)]);
    }
  }
  return keys;
}

// Bytes of `n` floats, sometimes a few bytes short or long.
std::string Floats(FuzzedDataProvider& in, size_t n) {
  std::string out(n * 4, '\0');
  for (size_t i = 0; i < n; ++i) {
    float v = in.ConsumeIntegralInRange<int>(0, 31) == 0 ? in.ConsumeFloatingPoint<float>()
                                                         : in.ConsumeFloatingPointInRange<float>(-2, 2);
    memcpy(out.data() + 4 * i, &v, 4);
  }
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
    out.resize(in.ConsumeBool() ? out.size() + 1 : out.size() - std::min<size_t>(out.size(), 1));
  }
  return out;
}

// Lengths that cut `n` bytes into pieces, as receive buffers do.
std::vector<size_t> Cuts(FuzzedDataProvider& in, size_t n) {
  std::vector<size_t> cuts;
  for (size_t at = 0; at < n;) {
    const size_t len = std::min(n - at, in.ConsumeIntegralInRange<size_t>(1, 700));
    cuts.push_back(len);
    at += len;
  }
  return cuts;
}

// `bytes` as gRPC hands a message to the server: in receive buffers.
grpc::ByteBuffer Received(FuzzedDataProvider& in, const std::string& bytes) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t len : Cuts(in, bytes.size())) {
    slices.emplace_back(bytes.data() + at, len);
    at += len;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

template <typename Proto>
bool ParseRaw(FuzzedDataProvider& in, Proto* message) {
  const std::string bytes = in.ConsumeRandomLengthString(4096);
  return message->ParseFromString(bytes);
}

size_t ElementBytes(v1::DType dtype) {
  return dtype == v1::DTYPE_FP16 || dtype == v1::DTYPE_BF16 ? 2 : 4;
}

void CheckLookupAnswer(const v1::LookupRequest& request, const v1::LookupResponse& response) {
  if (response.tables_size() != request.tables_size()) {
    Fail("lookup answer", "tables " + std::to_string(response.tables_size()) + " for " +
                              std::to_string(request.tables_size()));
  }
  for (int i = 0; i < request.tables_size(); ++i) {
    const auto& rows = response.tables(i);
    const uint64_t keys = request.tables(i).keys().size() / 8;
    if (rows.table() != request.tables(i).table() ||
        rows.rows().size() != keys * rows.dim() * ElementBytes(rows.dtype()) ||
        rows.missing() > keys) {
      Fail("lookup answer", "table '" + rows.table() + "' keys " + std::to_string(keys) +
                                " dim " + std::to_string(rows.dim()) + " row bytes " +
                                std::to_string(rows.rows().size()));
    }
  }
}

void RunOne(Shard& shard, FuzzedDataProvider& in) {
  const std::string before = Fingerprint(shard);
  const int op = in.ConsumeIntegralInRange<int>(0, 9);
  absl::Status status;
  bool changes_nothing_on_error = true;
  switch (op) {
    case 0: {  // a raw LookupRequest
      v1::LookupRequest request;
      if (!ParseRaw(in, &request)) return;
      v1::LookupResponse response;
      status = shard.Lookup(request, &response, absl::Now());
      if (status.ok()) CheckLookupAnswer(request, response);
      break;
    }
    case 1: {  // a raw PushRequest
      v1::PushRequest request;
      if (!ParseRaw(in, &request)) return;
      v1::PushResponse response;
      status = shard.Push(request, &response);
      break;
    }
    case 2: {  // a raw ExchangeRequest: its push may stand when its lookup fails
      v1::ExchangeResponse response;
      changes_nothing_on_error = false;
      if (in.ConsumeBool()) {  // as a stream reads it, gradients left in place
        grpc::ByteBuffer bytes = Received(in, in.ConsumeRandomLengthString(4096));
        ReceivedExchange request;
        if (!request.Parse(&bytes)) return;
        status = shard.Exchange(request.message(), &response, absl::Now(),
                                request.gradient_pieces());
        break;
      }
      v1::ExchangeRequest request;
      if (!ParseRaw(in, &request)) return;
      status = shard.Exchange(request, &response, absl::Now());
      break;
    }
    case 3: {  // a raw TableConfig
      v1::TableConfig config;
      if (!ParseRaw(in, &config)) return;
      v1::CreateTableResponse response;
      status = shard.CreateTable(config, &response);
      break;
    }
    case 4:
    case 5: {  // a lookup built over the tables
      v1::LookupRequest request;
      const int tables = in.ConsumeIntegralInRange<int>(1, 3);
      for (int t = 0; t < tables; ++t) {
        auto* table = request.add_tables();
        table->set_table(TableName(in));
        table->set_keys(PackKeys(Keys(in)));
        if (in.ConsumeBool()) table->set_dtype(static_cast<v1::DType>(in.ConsumeIntegralInRange<int>(0, 4)));
        table->set_read_only(in.ConsumeBool());
      }
      if (in.ConsumeBool()) {
        request.set_step(in.ConsumeIntegral<int64_t>());
        request.set_staleness(in.ConsumeIntegral<uint32_t>());
        request.set_worker_id(in.ConsumeIntegralInRange<uint32_t>(0, 3));
      }
      v1::LookupResponse response;
      status = shard.Lookup(request, &response, absl::Now());
      if (status.ok()) CheckLookupAnswer(request, response);
      break;
    }
    case 6:
    case 7: {  // a push built over the tables
      v1::PushRequest request;
      const int tables = in.ConsumeIntegralInRange<int>(1, 3);
      for (int t = 0; t < tables; ++t) {
        auto* table = request.add_tables();
        table->set_table(TableName(in));
        const std::vector<uint64_t> keys = Keys(in);
        table->set_keys(PackKeys(keys));
        table->set_gradients(Floats(in, keys.size() * DimOf(table->table())));
      }
      request.set_worker_id(in.ConsumeIntegralInRange<uint32_t>(0, 3));
      request.set_step(in.ConsumeBool() ? in.ConsumeIntegral<int64_t>()
                                        : in.ConsumeIntegralInRange<int64_t>(-1, 8));
      v1::PushResponse response;
      // Half the pushes hand their gradients over in pieces.
      std::vector<std::string> moved;
      std::vector<std::vector<absl::string_view>> pieces;
      std::vector<const std::vector<absl::string_view>*> in_place;
      if (in.ConsumeBool()) {
        for (auto& t : *request.mutable_tables()) moved.push_back(std::move(*t.mutable_gradients()));
        for (auto& t : *request.mutable_tables()) t.clear_gradients();
        for (const std::string& bytes : moved) {
          pieces.emplace_back();
          size_t at = 0;
          for (size_t len : Cuts(in, bytes.size())) {
            pieces.back().push_back(absl::string_view(bytes).substr(at, len));
            at += len;
          }
        }
        for (const auto& p : pieces) in_place.push_back(p.empty() && in.ConsumeBool() ? nullptr : &p);
      }
      status = shard.Push(request, &response, in_place);
      if (status.ok() && !response.duplicate() && response.tables_size() != request.tables_size()) {
        Fail("push answer", std::to_string(response.tables_size()) + " tables for " +
                                std::to_string(request.tables_size()));
      }
      break;
    }
    case 8: {  // workers come and go
      if (in.ConsumeBool()) {
        v1::RegisterWorkerRequest request;
        request.set_worker_id(in.ConsumeIntegralInRange<uint32_t>(0, 3));
        request.set_first_step(in.ConsumeBool() ? in.ConsumeIntegral<int64_t>()
                                                : in.ConsumeIntegralInRange<int64_t>(-1, 8));
        v1::RegisterWorkerResponse response;
        status = shard.RegisterWorker(request, &response);
      } else {
        v1::UnregisterWorkerRequest request;
        request.set_worker_id(in.ConsumeIntegralInRange<uint32_t>(0, 3));
        v1::UnregisterWorkerResponse response;
        shard.UnregisterWorker(request, &response);
      }
      return;
    }
    default: {  // tables come and go
      status = shard.DropTable(TableName(in));
      break;
    }
  }
  if (!status.ok() && changes_nothing_on_error) {
    if (status.message().empty()) Fail("refusal", "empty message for " + status.ToString());
    const std::string after = Fingerprint(shard);
    if (after != before) {
      Fail("a refused request changed the shard",
           status.ToString() + "\n  before: " + before + "\n  after:  " + after);
    }
  }
}

}  // namespace
}  // namespace ember::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember;
  google::protobuf::LogSilencer silence;  // invalid UTF-8 in a raw request is logged: noise
  ShardOptions options;
  options.shard_index = 0;
  options.shard_count = fuzz::kShards;
  options.max_keys_per_request = 64;
  options.max_message_bytes = 16 * 1024;  // a lookup of many wide rows is refused
  options.max_tables = 5;
  options.max_rows = 200;
  Shard shard(options);
  for (const auto& config : fuzz::FuzzTables()) {
    v1::CreateTableResponse response;
    if (!shard.CreateTable(config, &response).ok()) fuzz::Fail("setup", config.name());
  }
  FuzzedDataProvider in(data, size);
  for (size_t i = 0; i < fuzz::kMaxOps && in.remaining_bytes() > 0; ++i) fuzz::RunOne(shard, in);
  return 0;
}
