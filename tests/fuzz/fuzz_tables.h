// The tables the fuzz targets run against: small, one per storage dtype and
// optimizer family, with eviction and admission, so that every store path a
// request can reach is reachable.
#pragma once

#include <string>
#include <vector>

#include "ember/v1/types.pb.h"

namespace ember::fuzz {

inline std::vector<v1::TableConfig> FuzzTables() {
  std::vector<v1::TableConfig> tables(4);
  tables[0].set_name("a");
  tables[0].set_dim(4);
  tables[0].set_dtype(v1::DTYPE_FP32);
  tables[0].mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
  tables[0].mutable_initializer()->mutable_uniform()->set_min(-0.5f);
  tables[0].mutable_initializer()->mutable_uniform()->set_max(0.5f);
  tables[0].set_capacity(64);
  tables[0].set_eviction(v1::EVICTION_POLICY_LRU);

  tables[1].set_name("b");
  tables[1].set_dim(3);
  tables[1].set_dtype(v1::DTYPE_FP16);
  tables[1].mutable_optimizer()->mutable_adam()->set_learning_rate(0.01f);
  tables[1].mutable_initializer()->mutable_normal()->set_stddev(0.1f);
  tables[1].set_eviction(v1::EVICTION_POLICY_LFU);
  tables[1].set_capacity(32);
  tables[1].mutable_ttl()->set_steps(4);

  tables[2].set_name("c");
  tables[2].set_dim(1);
  tables[2].set_dtype(v1::DTYPE_BF16);
  tables[2].mutable_optimizer()->mutable_ftrl()->set_learning_rate(0.05f);
  tables[2].mutable_initializer()->mutable_constant()->set_value(0.125f);
  tables[2].mutable_admission()->set_min_count(2);
  tables[2].mutable_admission()->set_sketch_width(256);

  // Wide rows (512 bytes): a shard reads those of a push by address.
  tables[3].set_name("w");
  tables[3].set_dim(128);
  tables[3].set_dtype(v1::DTYPE_FP32);
  tables[3].mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  tables[3].mutable_initializer()->mutable_constant()->set_value(0.5f);
  tables[3].set_capacity(64);
  return tables;
}

}  // namespace ember::fuzz
