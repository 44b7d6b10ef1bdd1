// Builders for wire messages used by the shard and server tests.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/key_hash.h"
#include "common/key_router.h"
#include "common/wire.h"
#include "ember/v1/admin_service.pb.h"
#include "ember/v1/embedding_service.pb.h"

namespace ember::testing {

inline v1::TableConfig AdagradTable(const std::string& name, uint32_t dim) {
  v1::TableConfig c;
  c.set_name(name);
  c.set_dim(dim);
  c.mutable_initializer()->mutable_uniform()->set_min(-0.1f);
  c.mutable_initializer()->mutable_uniform()->set_max(0.1f);
  c.mutable_initializer()->set_seed(7);
  c.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.01f);
  c.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator(0.1f);
  return c;
}

// SGD with learning rate 1 over zero rows: a row is minus the sum of the
// gradients applied to it, which makes counting applied pushes exact.
inline v1::TableConfig CountingTable(const std::string& name, uint32_t dim) {
  v1::TableConfig c;
  c.set_name(name);
  c.set_dim(dim);
  c.mutable_initializer()->mutable_zeros();
  c.mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0f);
  return c;
}

// Every optimizer with every storage dtype, one table each, named
// "<optimizer>_<dtype>" ("adam_fp16").
inline std::vector<v1::TableConfig> EveryOptimizerAndDtype(uint32_t dim) {
  std::vector<v1::TableConfig> out;
  const std::pair<const char*, v1::DType> dtypes[] = {
      {"fp32", v1::DTYPE_FP32}, {"fp16", v1::DTYPE_FP16}, {"bf16", v1::DTYPE_BF16}};
  for (const std::string opt : {"sgd", "adagrad", "adam", "ftrl", "rmsprop"}) {
    for (const auto& [dname, dtype] : dtypes) {
      v1::TableConfig c;
      c.set_name(opt + "_" + dname);
      c.set_dim(dim);
      c.set_dtype(dtype);
      c.mutable_initializer()->mutable_uniform()->set_min(-0.1f);
      c.mutable_initializer()->mutable_uniform()->set_max(0.1f);
      c.mutable_initializer()->set_seed(11);
      v1::Optimizer* o = c.mutable_optimizer();
      if (opt == "sgd") o->mutable_sgd()->set_learning_rate(0.05f);
      if (opt == "adagrad") o->mutable_adagrad()->set_learning_rate(0.05f);
      if (opt == "adam") o->mutable_adam()->set_learning_rate(0.01f);
      if (opt == "rmsprop") o->mutable_rmsprop()->set_learning_rate(0.01f);
      if (opt == "ftrl") {
        o->mutable_ftrl()->set_learning_rate(0.05f);
        o->mutable_ftrl()->set_l1(0.001f);
        o->mutable_ftrl()->set_l2(0.001f);
      }
      out.push_back(c);
    }
  }
  return out;
}

// Keys owned by `shard` of `count`, in a fixed pseudo-random order.
inline std::vector<uint64_t> OwnedKeys(uint32_t shard, uint32_t count, size_t n,
                                       uint64_t start = 1) {
  std::vector<uint64_t> keys;
  for (uint64_t k = start; keys.size() < n; ++k) {
    const uint64_t key = Mix64(k);
    if (DefaultShardOf(key, count) == shard) keys.push_back(key);
  }
  return keys;
}

inline void AddLookup(v1::LookupRequest* r, const std::string& table,
                      const std::vector<uint64_t>& keys, bool read_only = false) {
  v1::TableLookup* t = r->add_tables();
  t->set_table(table);
  t->set_keys(PackKeys(keys));
  t->set_read_only(read_only);
}

inline void AddGradients(v1::PushRequest* r, const std::string& table,
                         const std::vector<uint64_t>& keys, const std::vector<float>& grads) {
  v1::TableGradients* t = r->add_tables();
  t->set_table(table);
  t->set_keys(PackKeys(keys));
  t->set_dtype(v1::DTYPE_FP32);
  t->set_gradients(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
}

inline std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

}  // namespace ember::testing
