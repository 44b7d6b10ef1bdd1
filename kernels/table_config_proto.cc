#include "kernels/table_config_proto.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"

namespace ember {
namespace {

absl::Status Invalid(const v1::TableConfig& c, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("table '", c.name(), "' field '", field, "': ", what));
}

float OrDefault(float v, float d) { return v == 0.0f ? d : v; }

std::string ShortText(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(m, &s);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s.empty() ? "{}" : s;
}

}  // namespace

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view table,
                                     absl::string_view field) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FP32: return DType::kFp32;
    case v1::DTYPE_FP16: return DType::kFp16;
    case v1::DTYPE_BF16: return DType::kBf16;
    default:
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "' field '", field,
                                                     "': expected DTYPE_FP32, DTYPE_FP16 or "
                                                     "DTYPE_BF16, received ",
                                                     static_cast<int>(dtype)));
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFp32: return v1::DTYPE_FP32;
    case DType::kFp16: return v1::DTYPE_FP16;
    case DType::kBf16: return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<v1::TableConfig> NormalizeTableConfig(const v1::TableConfig& in) {
  v1::TableConfig c = in;
  auto dtype = DTypeFromProto(c.dtype(), c.name(), "dtype");
  if (!dtype.ok()) return dtype.status();
  c.set_dtype(DTypeToProto(*dtype));
  if (!c.has_initializer() || c.initializer().kind_case() == v1::Initializer::KIND_NOT_SET) {
    return Invalid(c, "initializer", "required (zeros, constant, uniform, normal or truncated_normal)");
  }
  if (!c.has_optimizer() || c.optimizer().kind_case() == v1::Optimizer::KIND_NOT_SET) {
    return Invalid(c, "optimizer", "required (sgd, adagrad, adam, ftrl or rmsprop)");
  }
  v1::Optimizer* o = c.mutable_optimizer();
  switch (o->kind_case()) {
    case v1::Optimizer::kAdagrad:
      o->mutable_adagrad()->set_epsilon(OrDefault(o->adagrad().epsilon(), 1e-7f));
      break;
    case v1::Optimizer::kAdam: {
      v1::Optimizer::Adam* a = o->mutable_adam();
      a->set_beta1(OrDefault(a->beta1(), 0.9f));
      a->set_beta2(OrDefault(a->beta2(), 0.999f));
      a->set_epsilon(OrDefault(a->epsilon(), 1e-8f));
      break;
    }
    case v1::Optimizer::kFtrl:
      o->mutable_ftrl()->set_beta(OrDefault(o->ftrl().beta(), 1.0f));
      break;
    case v1::Optimizer::kRmsprop: {
      v1::Optimizer::RmsProp* r = o->mutable_rmsprop();
      r->set_rho(OrDefault(r->rho(), 0.9f));
      r->set_epsilon(OrDefault(r->epsilon(), 1e-7f));
      break;
    }
    default: break;
  }
  if (c.eviction() != v1::EVICTION_POLICY_NONE && c.eviction() != v1::EVICTION_POLICY_LRU &&
      c.eviction() != v1::EVICTION_POLICY_LFU) {
    return Invalid(c, "eviction",
                   absl::StrCat("expected EVICTION_POLICY_NONE, EVICTION_POLICY_LRU or "
                                "EVICTION_POLICY_LFU, received ",
                                static_cast<int>(c.eviction())));
  }
  if (c.eviction() != v1::EVICTION_POLICY_NONE && c.capacity() == 0) {
    return Invalid(c, "capacity", "an eviction policy needs a capacity > 0");
  }
  // "Off" has one spelling, so that equal meanings compare equal.
  if (c.ttl().seconds() == 0 && c.ttl().steps() == 0) c.clear_ttl();
  if (c.admission().min_count() <= 1) {
    c.clear_admission();
  } else if (c.admission().sketch_width() == 0) {
    c.mutable_admission()->set_sketch_width(AdmissionConfig::kDefaultSketchWidth);
  }
  return c;
}

absl::StatusOr<TableConfig> TableConfigFromProto(const v1::TableConfig& p) {
  TableConfig c;
  c.name = p.name();
  c.dim = p.dim();
  auto dtype = DTypeFromProto(p.dtype(), p.name(), "dtype");
  if (!dtype.ok()) return dtype.status();
  c.dtype = *dtype;
  const v1::Initializer& in = p.initializer();
  c.initializer.seed = in.seed();
  switch (in.kind_case()) {
    case v1::Initializer::kZeros: c.initializer.kind = InitializerKind::kZeros; break;
    case v1::Initializer::kConstant:
      c.initializer.kind = InitializerKind::kConstant;
      c.initializer.value = in.constant().value();
      break;
    case v1::Initializer::kUniform:
      c.initializer.kind = InitializerKind::kUniform;
      c.initializer.min = in.uniform().min();
      c.initializer.max = in.uniform().max();
      break;
    case v1::Initializer::kNormal:
      c.initializer.kind = InitializerKind::kNormal;
      c.initializer.mean = in.normal().mean();
      c.initializer.stddev = in.normal().stddev();
      break;
    case v1::Initializer::kTruncatedNormal:
      c.initializer.kind = InitializerKind::kTruncatedNormal;
      c.initializer.mean = in.truncated_normal().mean();
      c.initializer.stddev = in.truncated_normal().stddev();
      break;
    default: return Invalid(p, "initializer", "required");
  }
  const v1::Optimizer& o = p.optimizer();
  OptimizerConfig& oc = c.optimizer;
  switch (o.kind_case()) {
    case v1::Optimizer::kSgd:
      oc.kind = OptimizerKind::kSgd;
      oc.learning_rate = o.sgd().learning_rate();
      break;
    case v1::Optimizer::kAdagrad:
      oc.kind = OptimizerKind::kAdagrad;
      oc.learning_rate = o.adagrad().learning_rate();
      oc.initial_accumulator = o.adagrad().initial_accumulator();
      oc.epsilon = o.adagrad().epsilon();
      break;
    case v1::Optimizer::kAdam:
      oc.kind = OptimizerKind::kAdam;
      oc.learning_rate = o.adam().learning_rate();
      oc.beta1 = o.adam().beta1();
      oc.beta2 = o.adam().beta2();
      oc.epsilon = o.adam().epsilon();
      break;
    case v1::Optimizer::kFtrl:
      oc.kind = OptimizerKind::kFtrl;
      oc.learning_rate = o.ftrl().learning_rate();
      oc.ftrl_beta = o.ftrl().beta();
      oc.l1 = o.ftrl().l1();
      oc.l2 = o.ftrl().l2();
      oc.initial_accumulator = o.ftrl().initial_accumulator();
      break;
    case v1::Optimizer::kRmsprop:
      oc.kind = OptimizerKind::kRmsProp;
      oc.learning_rate = o.rmsprop().learning_rate();
      oc.rho = o.rmsprop().rho();
      oc.epsilon = o.rmsprop().epsilon();
      oc.initial_accumulator = o.rmsprop().initial_accumulator();
      break;
    default: return Invalid(p, "optimizer", "required");
  }
  c.capacity = p.capacity();
  switch (p.eviction()) {
    case v1::EVICTION_POLICY_LRU: c.eviction = EvictionPolicy::kLru; break;
    case v1::EVICTION_POLICY_LFU: c.eviction = EvictionPolicy::kLfu; break;
    default: c.eviction = EvictionPolicy::kNone; break;
  }
  c.ttl.seconds = p.ttl().seconds();
  c.ttl.steps = p.ttl().steps();
  c.admission.min_count = p.admission().min_count();
  c.admission.sketch_width = p.admission().sketch_width();
  if (absl::Status s = ValidateTableConfig(c); !s.ok()) return s;
  return c;
}

std::string TableConfigDifference(const v1::TableConfig& a, const v1::TableConfig& b) {
  using google::protobuf::util::MessageDifferencer;
  if (a.dim() != b.dim()) return absl::StrCat("dim: existing ", a.dim(), ", requested ", b.dim());
  if (a.dtype() != b.dtype()) {
    return absl::StrCat("dtype: existing ", v1::DType_Name(a.dtype()), ", requested ",
                        v1::DType_Name(b.dtype()));
  }
  if (!MessageDifferencer::Equals(a.initializer(), b.initializer())) {
    return absl::StrCat("initializer: existing ", ShortText(a.initializer()), ", requested ",
                        ShortText(b.initializer()));
  }
  if (!MessageDifferencer::Equals(a.optimizer(), b.optimizer())) {
    return absl::StrCat("optimizer: existing ", ShortText(a.optimizer()), ", requested ",
                        ShortText(b.optimizer()));
  }
  if (a.capacity() != b.capacity()) {
    return absl::StrCat("capacity: existing ", a.capacity(), ", requested ", b.capacity());
  }
  if (a.eviction() != b.eviction()) {
    return absl::StrCat("eviction: existing ", v1::EvictionPolicy_Name(a.eviction()),
                        ", requested ", v1::EvictionPolicy_Name(b.eviction()));
  }
  if (!MessageDifferencer::Equals(a.ttl(), b.ttl())) {
    return absl::StrCat("ttl: existing ", ShortText(a.ttl()), ", requested ", ShortText(b.ttl()));
  }
  if (!MessageDifferencer::Equals(a.admission(), b.admission())) {
    return absl::StrCat("admission: existing ", ShortText(a.admission()), ", requested ",
                        ShortText(b.admission()));
  }
  return "";
}

}  // namespace ember
