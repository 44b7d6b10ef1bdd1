// The rules every row of a table follows, written once for the CPU and CUDA
// stores (host and device both compile this file, EMBER_HD):
//   - an optimizer's rule: its state per element, the state's starting
//     values, and one element's update from its summed gradient;
//   - an eviction policy's rule: how a row's score moves when an access
//     reaches it (the store evicts the lowest score).
// The CPU store runs the optimizer rules through the vectorised row loop of
// kernels/optimizer_rows.h, the CUDA store per element in its kernels;
// both dispatch through VisitOptimizer, the one switch on OptimizerKind.
//
// Adding an optimizer: a rule struct below, its case in VisitOptimizer and
// its entry in kAllOptimizers; its enum value and hyper-parameters
// (kernels/table_config.h), their validation (kernels/table_config.cc) and
// its wire message (proto/ember/v1/types.proto, kernels/table_config_proto.cc).
// Adding an eviction policy: its case in TouchedScore; its enum value, name
// and wire value in the same three places.
//
// Numbers: weights and state are fp32 here (a store with fp16/bf16 rows
// converts around the call). The files that compile these rules build
// without FMA contraction (-ffp-contract=off, nvcc --fmad=false), so host
// and device give the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"
#include "kernels/table_config.h"

namespace ember::row {

// The most fp32 state values an optimizer keeps per row element. A row's
// state is slot-major: slot k of element j is state[k * dim + j].
inline constexpr uint32_t kMaxStateSlots = 2;

// An optimizer rule has:
//   kKind, kName
//   kStateSlots     state values per element (<= kMaxStateSlots)
//   kHasStep        keeps a per-row step count (advanced once per push that
//                   reaches the row, saturating), passed to StepSize
//   InitialState(c, k)              slot k's value in a new row
//   StepSize(c, t)                  the row's step size at step t (t >= 1)
//   Update(c, step_size, g, w, s)   one element: w and its slots s[0..)
//                                   from the summed gradient g
// Rules are stateless; their functions are static.

// w -= lr * g
struct Sgd {
  static constexpr OptimizerKind kKind = OptimizerKind::kSgd;
  static constexpr const char* kName = "sgd";
  static constexpr uint32_t kStateSlots = 0;
  static constexpr bool kHasStep = false;
  EMBER_HD static float InitialState(const OptimizerConfig&, uint32_t) { return 0.0f; }
  EMBER_HD static float StepSize(const OptimizerConfig&, uint32_t) { return 0.0f; }
  EMBER_HD static void Update(const OptimizerConfig& c, float, float g, float& w, float*) {
    w -= c.learning_rate * g;
  }
};

// acc += g^2; w -= lr * g / (sqrt(acc) + eps)   (TensorFlow's Adagrad).
struct Adagrad {
  static constexpr OptimizerKind kKind = OptimizerKind::kAdagrad;
  static constexpr const char* kName = "adagrad";
  static constexpr uint32_t kStateSlots = 1;  // acc
  static constexpr bool kHasStep = false;
  EMBER_HD static float InitialState(const OptimizerConfig& c, uint32_t) {
    return c.initial_accumulator;
  }
  EMBER_HD static float StepSize(const OptimizerConfig&, uint32_t) { return 0.0f; }
  EMBER_HD static void Update(const OptimizerConfig& c, float, float g, float& w, float* s) {
    s[0] += g * g;
    w -= c.learning_rate * g / (sqrtf(s[0]) + c.epsilon);
  }
};

// Lazy Adam: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// w -= step * m / (sqrt(v) + eps), with the bias corrections folded into the
// row's step size lr * sqrt(1 - b2^t) / (1 - b1^t).
struct Adam {
  static constexpr OptimizerKind kKind = OptimizerKind::kAdam;
  static constexpr const char* kName = "adam";
  static constexpr uint32_t kStateSlots = 2;  // m, v
  static constexpr bool kHasStep = true;
  EMBER_HD static float InitialState(const OptimizerConfig&, uint32_t) { return 0.0f; }
  EMBER_HD static float StepSize(const OptimizerConfig& c, uint32_t t) {
    const double b1t = pow(static_cast<double>(c.beta1), static_cast<double>(t));
    const double b2t = pow(static_cast<double>(c.beta2), static_cast<double>(t));
    return static_cast<float>(c.learning_rate * sqrt(1.0 - b2t) / (1.0 - b1t));
  }
  EMBER_HD static void Update(const OptimizerConfig& c, float step_size, float g, float& w,
                              float* s) {
    s[0] = c.beta1 * s[0] + (1.0f - c.beta1) * g;
    s[1] = c.beta2 * s[1] + (1.0f - c.beta2) * g * g;
    w -= step_size * s[0] / (sqrtf(s[1]) + c.epsilon);
  }
};

// FTRL-Proximal, McMahan et al. 2013, Algorithm 1 (alpha = learning_rate):
//   sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z += g - sigma w;  n += g^2
//   w = 0 if |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)
struct Ftrl {
  static constexpr OptimizerKind kKind = OptimizerKind::kFtrl;
  static constexpr const char* kName = "ftrl";
  static constexpr uint32_t kStateSlots = 2;  // z, n
  static constexpr bool kHasStep = false;
  EMBER_HD static float InitialState(const OptimizerConfig& c, uint32_t k) {
    return k == 0 ? 0.0f : c.initial_accumulator;
  }
  EMBER_HD static float StepSize(const OptimizerConfig&, uint32_t) { return 0.0f; }
  EMBER_HD static void Update(const OptimizerConfig& c, float, float g, float& w, float* s) {
    float& z = s[0];
    float& n = s[1];
    const float n_new = n + g * g;
    const float sigma = (sqrtf(n_new) - sqrtf(n)) / c.learning_rate;
    z += g - sigma * w;
    n = n_new;
    const float az = fabsf(z);
    if (az <= c.l1) {
      w = 0.0f;
    } else {
      const float sign_z = z < 0 ? -1.0f : 1.0f;
      w = -(z - sign_z * c.l1) / ((c.ftrl_beta + sqrtf(n)) / c.learning_rate + c.l2);
    }
  }
};

// RMSProp (Hinton's lecture 6e; Keras' RMSprop without momentum):
//   ms = rho ms + (1 - rho) g^2;  w -= lr * g / (sqrt(ms) + eps)
// Adagrad whose accumulator decays, so that a row's step size does not
// shrink for ever on a long-lived hot key.
struct RmsProp {
  static constexpr OptimizerKind kKind = OptimizerKind::kRmsProp;
  static constexpr const char* kName = "rmsprop";
  static constexpr uint32_t kStateSlots = 1;  // ms
  static constexpr bool kHasStep = false;
  EMBER_HD static float InitialState(const OptimizerConfig& c, uint32_t) {
    return c.initial_accumulator;
  }
  EMBER_HD static float StepSize(const OptimizerConfig&, uint32_t) { return 0.0f; }
  EMBER_HD static void Update(const OptimizerConfig& c, float, float g, float& w, float* s) {
    s[0] = c.rho * s[0] + (1.0f - c.rho) * g * g;
    w -= c.learning_rate * g / (sqrtf(s[0]) + c.epsilon);
  }
};

// Calls fn(Rule{}) with the rule of `kind` and returns what it returns. The
// one switch on OptimizerKind: a kind missing here fails the build (-Wswitch
// is an error in kernels/).
template <typename Fn>
EMBER_HD decltype(auto) VisitOptimizer(OptimizerKind kind, Fn&& fn) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return fn(Sgd{});
    case OptimizerKind::kAdagrad:
      return fn(Adagrad{});
    case OptimizerKind::kAdam:
      return fn(Adam{});
    case OptimizerKind::kFtrl:
      return fn(Ftrl{});
    case OptimizerKind::kRmsProp:
      return fn(RmsProp{});
  }
  return fn(Sgd{});  // not reached: kinds are validated when a table is made
}

// Every optimizer, for suites that cover them all.
inline constexpr OptimizerKind kAllOptimizers[] = {OptimizerKind::kSgd, OptimizerKind::kAdagrad,
                                                   OptimizerKind::kAdam, OptimizerKind::kFtrl,
                                                   OptimizerKind::kRmsProp};

// Slot k's starting value in a new row (k < the rule's kStateSlots).
EMBER_HD float InitialState(const OptimizerConfig& c, uint32_t k) {
  return VisitOptimizer(c.kind, [&](auto rule) { return decltype(rule)::InitialState(c, k); });
}

// Advances a row's step count (when the optimizer keeps one) and returns the
// step size of this update.
EMBER_HD float AdvanceStep(const OptimizerConfig& c, uint32_t& step) {
  return VisitOptimizer(c.kind, [&](auto rule) {
    using Rule = decltype(rule);
    if (!Rule::kHasStep) return 0.0f;
    if (step != 0xffffffffu) ++step;
    return Rule::StepSize(c, step);
  });
}

// One element of a row: w and its state, slot k at state[k * stride].
template <typename Rule>
EMBER_HD void UpdateElement(const OptimizerConfig& c, float step_size, float g, float& w,
                            float* state, uint64_t stride) {
  float s[kMaxStateSlots] = {};
  if constexpr (Rule::kStateSlots > 0) {
    for (uint32_t k = 0; k < Rule::kStateSlots; ++k) s[k] = state[k * stride];
  }
  Rule::Update(c, step_size, g, w, s);
  if constexpr (Rule::kStateSlots > 0) {
    for (uint32_t k = 0; k < Rule::kStateSlots; ++k) state[k * stride] = s[k];
  }
}

// ------------------------------------------------------------ eviction

// A row's score before any access has reached it. A row inserted by an
// access (a find-or-insert, a push) gets this, then that access's touch;
// imported rows keep the score they were exported with.
inline constexpr uint32_t kUntouchedScore = 0;

// The score of a row after one access at `clock` (the store's call count):
// LRU keeps the clock, LFU counts the accesses (saturating). Without
// eviction scores are not kept.
EMBER_HD uint32_t TouchedScore(EvictionPolicy policy, uint32_t score, uint32_t clock) {
  switch (policy) {
    case EvictionPolicy::kNone:
      return score;
    case EvictionPolicy::kLru:
      return clock;
    case EvictionPolicy::kLfu:
      return score == 0xffffffffu ? score : score + 1;
  }
  return score;
}

// The score of a row inserted by an access at `clock`.
EMBER_HD uint32_t InsertedScore(EvictionPolicy policy, uint32_t clock) {
  return TouchedScore(policy, kUntouchedScore, clock);
}

}  // namespace ember::row
