// SerializeAliased: protobuf's exact bytes, large fields as slices of the
// message itself, and the message kept alive exactly as long as they are.
#include "common/aliased_serialize.h"

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ember/v1/embedding_service.pb.h"

namespace ember {
namespace {

std::string Bytes(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + 31 * i);
  return s;
}

std::vector<grpc::Slice> Slices(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  return slices;
}

// A lookup answer with rows of the given sizes, and a push answer.
std::shared_ptr<v1::ExchangeResponse> Answer(const std::vector<size_t>& rows_bytes) {
  auto r = std::make_shared<v1::ExchangeResponse>();
  v1::TablePushResult* p = r->mutable_push()->add_tables();
  p->set_table("users");
  p->set_updated(7);
  for (size_t i = 0; i < rows_bytes.size(); ++i) {
    v1::TableRows* t = r->mutable_lookup()->add_tables();
    t->set_table("table" + std::to_string(i));
    t->set_dtype(v1::DTYPE_FP32);
    t->set_dim(8);
    t->set_missing(i * 70000);
    *t->mutable_rows() = Bytes(rows_bytes[i], static_cast<int>(i));
  }
  return r;
}

// A step request: gradients and keys of the given sizes.
std::shared_ptr<v1::ExchangeRequest> Request(size_t keys_bytes, size_t grad_bytes) {
  auto r = std::make_shared<v1::ExchangeRequest>();
  r->mutable_push()->set_step(41);
  r->mutable_push()->set_worker_id(3);
  v1::TableGradients* g = r->mutable_push()->add_tables();
  g->set_table("clicks");
  *g->mutable_keys() = Bytes(keys_bytes, 1);
  *g->mutable_gradients() = Bytes(grad_bytes, 2);
  v1::TableLookup* l = r->mutable_lookup()->add_tables();
  l->set_table("clicks");
  *l->mutable_keys() = Bytes(keys_bytes, 3);
  r->mutable_lookup()->set_step(42);
  return r;
}

TEST(AliasedSerializeTest, BytesAreExactlyProtobufsOwn) {
  std::vector<std::shared_ptr<const google::protobuf::Message>> messages = {
      std::make_shared<v1::ExchangeResponse>(),
      Answer({}),
      Answer({0, 32, 100}),
      Answer({kAliasedSerializeBlockBytes - 1, kAliasedSerializeBlockBytes,
              kAliasedSerializeBlockBytes + 1, 3 * 1024 * 1024 + 5, 64, 200000}),
      Request(8, 32),
      Request(8 * 900, 4 * 8 * 900),
      Request(8 * 40000, 4 * 128 * 40000),
  };
  for (const auto& m : messages) {
    const std::string expected = m->SerializeAsString();
    const grpc::ByteBuffer buffer = SerializeAliased(m);
    EXPECT_EQ(buffer.Length(), expected.size());
    EXPECT_TRUE(FlattenByteBuffer(buffer) == expected) << m->ShortDebugString().substr(0, 300);
  }
}

TEST(AliasedSerializeTest, LargeFieldsTravelAsSlicesOfTheMessageItselfAndSmallOnesAreCopied) {
  auto m = Answer({16, 100, kAliasedSerializeBlockBytes, 500000});
  const grpc::ByteBuffer buffer = SerializeAliased(m);
  const std::vector<grpc::Slice> slices = Slices(buffer);
  auto aliased = [&](const std::string& field) {
    for (const grpc::Slice& s : slices) {
      if (reinterpret_cast<const char*>(s.begin()) == field.data() && s.size() == field.size()) {
        return true;
      }
    }
    return false;
  };
  const auto& tables = m->lookup().tables();
  EXPECT_FALSE(aliased(tables[0].rows()));
  EXPECT_FALSE(aliased(tables[1].rows()));
  EXPECT_TRUE(aliased(tables[2].rows()));
  EXPECT_TRUE(aliased(tables[3].rows()));
}

TEST(AliasedSerializeTest, TheMessageLivesUntilGrpcReleasesItsLastSlice) {
  std::weak_ptr<v1::ExchangeResponse> watch;
  auto buffer = std::make_unique<grpc::ByteBuffer>();
  {
    auto m = Answer({500000});
    watch = m;
    *buffer = SerializeAliased(std::move(m));
  }
  ASSERT_FALSE(watch.expired());  // the buffer holds it
  const std::string bytes = FlattenByteBuffer(*buffer);
  EXPECT_EQ(bytes.size(), watch.lock()->ByteSizeLong());
  buffer.reset();
  EXPECT_TRUE(watch.expired());
}

TEST(AliasedSerializeTest, CopiedBytesAreProtobufsOwnInOneSliceThatOutlivesTheMessage) {
  for (size_t grad_bytes : {size_t{32}, size_t{4 * 128 * 40000}}) {
    auto m = Request(8, grad_bytes);
    const std::string expected = m->SerializeAsString();
    const auto grads = reinterpret_cast<uintptr_t>(m->push().tables(0).gradients().data());
    grpc::ByteBuffer buffer = SerializeCopied(*m);
    m.reset();
    const std::vector<grpc::Slice> slices = Slices(buffer);
    EXPECT_EQ(slices.size(), 1u);
    for (const grpc::Slice& s : slices) EXPECT_NE(reinterpret_cast<uintptr_t>(s.begin()), grads);
    EXPECT_TRUE(FlattenByteBuffer(buffer) == expected);
  }
}

TEST(AliasedSerializeTest, AMessageWithNoLargeFieldIsNotKept) {
  std::weak_ptr<v1::ExchangeResponse> watch;
  grpc::ByteBuffer buffer;
  {
    auto m = Answer({64});
    watch = m;
    buffer = SerializeAliased(std::move(m));
  }
  EXPECT_TRUE(watch.expired());
  EXPECT_GT(buffer.Length(), 64u);
}

TEST(AliasedSerializeTest, ParseAndClearReadsBackWhatWasSentAndRefusesOtherBytes) {
  auto sent = Answer({64, 500000});
  grpc::ByteBuffer buffer = SerializeAliased(sent);
  v1::ExchangeResponse parsed;
  ASSERT_TRUE(ParseAndClear(&buffer, &parsed));
  EXPECT_EQ(parsed.SerializeAsString(), sent->SerializeAsString());
  EXPECT_EQ(buffer.Length(), 0u);

  const std::string junk = "\xff\xff\xff\xff";  // a tag with a truncated varint
  grpc::Slice slice(junk);
  grpc::ByteBuffer bad(&slice, 1);
  EXPECT_FALSE(ParseAndClear(&bad, &parsed));
  EXPECT_EQ(bad.Length(), 0u);
}

}  // namespace
}  // namespace ember
