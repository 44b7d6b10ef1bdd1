// Per-element optimizer updates, shared by the CPU and CUDA stores.
//
// A store sums the gradients of duplicate keys first, then calls one of these
// per element of the row. Weights and state are fp32 here; a store with fp16
// or bf16 rows converts around the call.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"
#include "kernels/table_config.h"

namespace ember::opt {

EMBER_HD void Sgd(const OptimizerConfig& c, float g, float& w) { w -= c.learning_rate * g; }

// acc += g^2; w -= lr * g / (sqrt(acc) + eps)   (TensorFlow's Adagrad).
EMBER_HD void Adagrad(const OptimizerConfig& c, float g, float& w, float& acc) {
  acc += g * g;
  w -= c.learning_rate * g / (sqrtf(acc) + c.epsilon);
}

// Step size of Adam at the row's step t (t >= 1, after increment):
// lr * sqrt(1 - beta2^t) / (1 - beta1^t).
EMBER_HD float AdamStepSize(const OptimizerConfig& c, uint32_t t) {
  double b1t = pow(static_cast<double>(c.beta1), static_cast<double>(t));
  double b2t = pow(static_cast<double>(c.beta2), static_cast<double>(t));
  return static_cast<float>(c.learning_rate * sqrt(1.0 - b2t) / (1.0 - b1t));
}

// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w -= step * m / (sqrt(v) + eps).
EMBER_HD void Adam(const OptimizerConfig& c, float step_size, float g, float& w, float& m,
                   float& v) {
  m = c.beta1 * m + (1.0f - c.beta1) * g;
  v = c.beta2 * v + (1.0f - c.beta2) * g * g;
  w -= step_size * m / (sqrtf(v) + c.epsilon);
}

// FTRL-Proximal, McMahan et al. 2013, Algorithm 1 (alpha = learning_rate):
//   sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z += g - sigma w;  n += g^2
//   w = 0 if |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)
EMBER_HD void Ftrl(const OptimizerConfig& c, float g, float& w, float& z, float& n) {
  float n_new = n + g * g;
  float sigma = (sqrtf(n_new) - sqrtf(n)) / c.learning_rate;
  z += g - sigma * w;
  n = n_new;
  float az = fabsf(z);
  if (az <= c.l1) {
    w = 0.0f;
  } else {
    float sign_z = z < 0 ? -1.0f : 1.0f;
    w = -(z - sign_z * c.l1) / ((c.ftrl_beta + sqrtf(n)) / c.learning_rate + c.l2);
  }
}

}  // namespace ember::opt
