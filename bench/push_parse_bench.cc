// What the shard saves by reading a push's gradients where they arrived: a
// shard's half of the reference node step (17 tables, fresh keys per step)
// serialised, cut into receive buffers the size gRPC hands a shard on
// loopback (about 60 KB each, measured with dim 128), then parsed and
// applied the two ways, alternating round by round:
//   copy:     ParseAndClear (protobuf copies every gradients field) + Shard::Push
//   in place: ReceivedExchange::Parse + Shard::Push with the pieces
// Prints the median us per push and per-row ns of each, and in place / copy.
//   build/bench/push_parse_bench [--dims=8,32,128,256 --rounds=7]
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "common/aliased_serialize.h"
#include "server/received_exchange.h"
#include "shard/shard.h"

ABSL_FLAG(std::string, dims, "8,32,128,256", "Row dimensions to measure.");
ABSL_FLAG(int, tables, 17, "Tables (one per sparse feature).");
ABSL_FLAG(int, keys_per_table, 200, "Keys per table per push (a shard's half of a node step).");
ABSL_FLAG(int, messages, 16, "Distinct pushes cycled (more bytes than the L2 cache holds).");
ABSL_FLAG(int, slice_bytes, 60000, "Receive buffer size the serialised push is cut into.");
ABSL_FLAG(int, rounds, 7, "Alternating rounds; medians are printed.");
ABSL_FLAG(int, reps, 20, "Passes over the pushes per round and way.");
ABSL_FLAG(bool, only_in_place, false, "Run only the in-place way (for a profile).");

namespace ember {
namespace {

// `message` as gRPC would hand it to the server: its bytes copied into
// receive buffers of `slice_bytes`.
grpc::ByteBuffer AsReceived(const v1::ExchangeRequest& message, size_t slice_bytes) {
  const std::string bytes = message.SerializeAsString();
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += slice_bytes) {
    const size_t n = std::min(slice_bytes, bytes.size() - at);
    slices.emplace_back(bytes.data() + at, n);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

int Main() {
  const int tables = absl::GetFlag(FLAGS_tables);
  const int keys_per_table = absl::GetFlag(FLAGS_keys_per_table);
  const int messages = absl::GetFlag(FLAGS_messages);
  const int reps = absl::GetFlag(FLAGS_reps);
  std::printf("%-5s %12s %12s %14s %14s %9s\n", "dim", "copy us", "in place us", "copy ns/row",
              "in place ns/row", "in/copy");
  for (double d : bench::ParseList(absl::GetFlag(FLAGS_dims))) {
    const uint32_t dim = static_cast<uint32_t>(d);
    Shard shard{ShardOptions{}};
    v1::CreateTableResponse created;
    for (int t = 0; t < tables; ++t) {
      v1::TableConfig c;
      c.set_name(absl::StrCat("f", t));
      c.set_dim(dim);
      c.mutable_initializer()->mutable_uniform()->set_min(-0.1f);
      c.mutable_initializer()->mutable_uniform()->set_max(0.1f);
      c.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.01f);
      c.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator(0.1f);
      if (absl::Status s = shard.CreateTable(c, &created); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<uint64_t> key(0, 200'000);
    std::normal_distribution<float> grad(0.0f, 0.01f);
    std::vector<grpc::ByteBuffer> received;
    for (int m = 0; m < messages; ++m) {
      v1::ExchangeRequest r;
      for (int t = 0; t < tables; ++t) {
        v1::TableGradients* g = r.mutable_push()->add_tables();
        g->set_table(absl::StrCat("f", t));
        g->set_dtype(v1::DTYPE_FP32);
        std::vector<uint64_t> keys(keys_per_table);
        for (uint64_t& k : keys) k = key(rng);
        std::sort(keys.begin(), keys.end());
        keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
        g->set_keys(std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * 8));
        std::vector<float> values(keys.size() * dim);
        for (float& v : values) v = grad(rng);
        g->set_gradients(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
      }
      received.push_back(AsReceived(r, absl::GetFlag(FLAGS_slice_bytes)));
    }
    uint64_t rows = 0;
    v1::ExchangeRequest copied;
    ReceivedExchange in_place;
    v1::PushResponse response;
    // One pass over every push the one way (0: copy, 1: in place); us per push.
    auto pass = [&](int way) {
      const auto start = std::chrono::steady_clock::now();
      for (int rep = 0; rep < reps; ++rep) {
        for (const grpc::ByteBuffer& bytes : received) {
          grpc::ByteBuffer buffer(bytes);  // shares the slices, as a read does
          response.Clear();
          absl::Status s;
          if (way == 0) {
            if (!ParseAndClear(&buffer, &copied)) std::abort();
            s = shard.Push(copied.push(), &response);
          } else {
            if (!in_place.Parse(&buffer)) std::abort();
            s = shard.Push(in_place.message().push(), &response, in_place.gradient_pieces());
          }
          if (!s.ok()) {
            std::fprintf(stderr, "%s\n", s.ToString().c_str());
            std::abort();
          }
        }
      }
      const double us = std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - start).count();
      return us / (reps * messages);
    };
    pass(0);  // inserts every key: the rounds then update stored rows
    for (const auto& t : response.tables()) rows += t.updated();
    std::vector<double> us[2];
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      for (int way : {round % 2, 1 - round % 2}) {
        if (way == 0 && absl::GetFlag(FLAGS_only_in_place)) continue;
        us[way].push_back(pass(way));
      }
    }
    const double copy = bench::Median(us[0]), place = bench::Median(us[1]);
    std::printf("%-5u %12.1f %12.1f %14.1f %14.1f %9.3f\n", dim, copy, place,
                1000 * copy / rows, 1000 * place / rows, place / copy);
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::Main();
}
