#include "server/received_exchange.h"

#include <grpcpp/support/byte_buffer.h>

namespace ember {

// ExchangeRequest.push (1) -> PushRequest.tables (1) -> TableGradients.gradients (4).
constexpr int kGradientsPath[] = {1, 1, 4};

bool ReceivedExchange::Parse(grpc::ByteBuffer* bytes) {
  pieces_.clear();
  slices_ = nullptr;  // after the pieces that point into them
  wire_bytes_ = bytes->Length();
  slices_ = ParseAndClearLeavingInPlace(bytes, kGradientsPath, &message_, &fields_);
  if (slices_ == nullptr) return false;
  const int tables = message_.push().tables_size();
  pieces_.resize(tables);
  for (int i = 0; i < tables; ++i) pieces_[i] = FindInPlace(fields_, message_.push().tables(i));
  return true;
}

}  // namespace ember
