// The library's half of ExchangeAnswer (ember/exchange_answer.h): how the
// channels fill one. A trainer only reads answers; it never includes this.
#pragma once

#include "ember/exchange_answer.h"
#include "ember/v1/embedding_service.pb.h"

namespace grpc {
class ByteBuffer;
}  // namespace grpc

namespace ember::internal {

struct ExchangeAnswerFill {
  // Reads a serialised ExchangeResponse into `answer`, leaving the rows in
  // `bytes`' slices (which the answer keeps) and emptying `bytes`; false if
  // it is not one, and the answer is then empty.
  static bool Parse(ExchangeAnswer& answer, grpc::ByteBuffer* bytes);
  // The message for a parser that stores the rows in their fields (a unary
  // call, the in-process channel); drops any rows held in place.
  static v1::ExchangeResponse* MutableMessage(ExchangeAnswer& answer);
};

}  // namespace ember::internal
