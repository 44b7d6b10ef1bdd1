// Fuzzes ParseLeavingInPlace (the exchange stream's receive path: the
// trainer's ExchangeAnswer reads rows this way) against protobuf's own
// parser.
//
// Input: byte 0 picks the message (even: an ExchangeResponse with its rows
// in place, odd: an ExchangeRequest with its gradients in place) and, with
// byte 1, where the bytes are cut into pieces (as gRPC's slices cut them);
// the rest is the serialised message.
//
// Checked (in_place_parse_check.h): bytes are accepted exactly when
// protobuf accepts them (bar a group, which only protobuf skips); every
// reported piece lies inside the input; and the message, with each reported
// value put back into its field, equals protobuf's.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ember/v1/embedding_service.pb.h"
#include "tests/common/in_place_parse_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember;
  if (size < 2) return 0;
  const bool request = data[0] & 1;
  const size_t every = 1 + ((data[0] >> 1) | (size_t{data[1]} << 7)) % 4096;
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 2), size - 2);
  std::vector<size_t> cuts;
  for (size_t c = every; c < bytes.size(); c += every) cuts.push_back(c);
  constexpr int kRowsPath[] = {2, 1, 4};
  constexpr int kGradientsPath[] = {1, 1, 4};
  const std::string problem =
      request ? testing::CheckInPlaceParse<v1::ExchangeRequest>(bytes, kGradientsPath, cuts)
              : testing::CheckInPlaceParse<v1::ExchangeResponse>(bytes, kRowsPath, cuts);
  if (!problem.empty()) {
    fprintf(stderr, "in_place_parse_fuzzer: %s\n", problem.c_str());
    abort();
  }
  return 0;
}
