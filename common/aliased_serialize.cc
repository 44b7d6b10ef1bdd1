#include "common/aliased_serialize.h"

#include <grpc/slice.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

#include "common/in_place_parse.h"

namespace ember {
namespace {

using google::protobuf::Message;

// Output stream of gRPC slices: what protobuf writes goes into refcounted
// blocks, emitted as sub-slices of them; what it aliases (only with an
// owner) becomes a slice that holds a reference to the owner.
class SliceStream final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  // Blocks of `block_bytes`.
  SliceStream(std::shared_ptr<const Message> owner, size_t block_bytes)
      : owner_(std::move(owner)), block_bytes_(block_bytes) {}
  ~SliceStream() override { grpc_slice_unref(block_); }

  bool Next(void** data, int* size) override {
    if (used_ == GRPC_SLICE_LENGTH(block_)) NewBlock();
    *data = GRPC_SLICE_START_PTR(block_) + used_;
    *size = static_cast<int>(GRPC_SLICE_LENGTH(block_) - used_);
    used_ = GRPC_SLICE_LENGTH(block_);
    bytes_ += *size;
    return true;
  }
  void BackUp(int count) override {
    used_ -= count;
    bytes_ -= count;
  }
  int64_t ByteCount() const override { return bytes_; }
  bool AllowsAliasing() const override { return owner_ != nullptr; }
  bool WriteAliasedRaw(const void* data, int size) override {
    EmitBlock();
    slices_.emplace_back(
        const_cast<void*>(data), static_cast<size_t>(size),
        [](void* p) { delete static_cast<std::shared_ptr<const Message>*>(p); },
        new std::shared_ptr<const Message>(owner_));
    bytes_ += size;
    return true;
  }

  grpc::ByteBuffer Finish() {
    EmitBlock();
    return grpc::ByteBuffer(slices_.data(), slices_.size());
  }

 private:
  // The written, not yet emitted part of the block, as a slice.
  void EmitBlock() {
    if (used_ == emitted_) return;
    slices_.emplace_back(grpc_slice_sub(block_, emitted_, used_), grpc::Slice::STEAL_REF);
    emitted_ = used_;
  }
  void NewBlock() {
    EmitBlock();
    grpc_slice_unref(block_);
    block_ = grpc_slice_malloc(block_bytes_);
    used_ = emitted_ = 0;
  }

  std::shared_ptr<const Message> owner_;
  const size_t block_bytes_;
  grpc_slice block_ = grpc_empty_slice();
  size_t used_ = 0;     // bytes of block_ handed out and not backed up
  size_t emitted_ = 0;  // bytes of block_ already in slices_
  int64_t bytes_ = 0;
  std::vector<grpc::Slice> slices_;
};

// Serialises `m` into slices; large fields by reference when `owner` (which
// holds `m`) is set. Without one, the whole message goes into one block.
grpc::ByteBuffer Serialize(const Message& m, std::shared_ptr<const Message> owner) {
  const size_t bytes = m.ByteSizeLong();  // also caches the sizes written below
  const size_t block = owner ? kAliasedSerializeBlockBytes
                             : std::max(kAliasedSerializeBlockBytes, bytes);
  SliceStream stream(std::move(owner), block);
  {
    google::protobuf::io::CodedOutputStream out(&stream);
    out.EnableAliasing(true);  // no effect without an owner: the stream refuses
    m.SerializeWithCachedSizes(&out);
  }  // hands back what it did not use
  return stream.Finish();
}

}  // namespace

grpc::ByteBuffer SerializeAliased(std::shared_ptr<const Message> message) {
  const Message& m = *message;
  return Serialize(m, std::move(message));
}

grpc::ByteBuffer SerializeCopied(const Message& message) { return Serialize(message, nullptr); }

std::string FlattenByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) return bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

bool ParseAndClear(grpc::ByteBuffer* buffer, Message* message) {
  bool parsed;
  {
    grpc::ProtoBufferReader reader(buffer);
    parsed = message->ParseFromZeroCopyStream(&reader);
  }
  buffer->Clear();
  return parsed;
}

std::shared_ptr<const void> ParseAndClearLeavingInPlace(grpc::ByteBuffer* buffer,
                                                        absl::Span<const int> path,
                                                        Message* message, InPlaceFields* fields) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  const bool dumped = buffer->Dump(slices.get()).ok();
  buffer->Clear();
  std::vector<absl::string_view> views;
  views.reserve(slices->size());
  for (const grpc::Slice& s : *slices) {
    views.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  fields->clear();
  const bool parsed =
      dumped && ParseLeavingInPlace(views, path, message,
                                    [&](Message* parent, std::vector<absl::string_view> value) {
                                      fields->emplace_back(parent, std::move(value));
                                    });
  if (!parsed) {
    message->Clear();
    fields->clear();
    return nullptr;
  }
  return slices;
}

}  // namespace ember
