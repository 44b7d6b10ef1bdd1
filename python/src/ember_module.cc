// ember._ember: the Python binding of the C ABI (ember/ember_c.h).
//
// Only the C ABI is used, so this module carries no gRPC, protobuf or Abseil
// of its own and loads beside TensorFlow or PyTorch. Every call that may
// block (network, waiting for a step) runs with the GIL released. Arrays come
// in through the buffer protocol without copies when they are C-contiguous
// and of the right type; failures raise ember.EmberError(code, message).
//
// Longer than most files on purpose: it binds every function of the C ABI,
// each a few lines (argument conversion, the GIL released), so the module's
// whole surface reads in one place.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ember/ember_c.h"

namespace py = pybind11;

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using OffsetArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using InverseArray = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>;

// Raises ember.EmberError(code, message) for a failed C call.
[[noreturn]] void Raise(int code, const std::string& message) {
  static py::handle error_class =
      py::object(py::module_::import("ember._errors").attr("EmberError")).release();
  PyErr_SetObject(error_class.ptr(), py::make_tuple(code, message).ptr());
  throw py::error_already_set();
}

// Runs a C call without the GIL, then raises its failure with the GIL held.
template <typename Fn>
void CallReleased(Fn&& fn) {
  int code;
  std::string message;
  {
    py::gil_scoped_release release;
    code = fn();
    if (code != 0) message = ember_last_error();
  }
  if (code != 0) Raise(code, message);
}

std::string TakeString(char* s) {
  std::string out(s);
  ember_free_string(s);
  return out;
}

// A read-only view of a 1-D, C-contiguous buffer of T (numpy arrays, bytes,
// array.array, memoryview): no copy. Other layouts or types are a TypeError
// naming `what` with expected vs received.
template <typename T>
struct ArrayView {
  py::buffer_info info;
  const T* data() const { return static_cast<const T*>(info.ptr); }
  size_t size() const { return static_cast<size_t>(info.size); }
};

template <typename T>
bool KindMatches(const std::string& format) {
  // Integer keys may arrive as int64 (TensorFlow, PyTorch) or uint64: the same
  // 8 bytes, read as uint64 (every uint64 is a valid key).
  const char f = format.empty() ? '?' : format.back();
  if constexpr (std::is_same_v<T, float>) return f == 'f';
  if constexpr (std::is_integral_v<T> && sizeof(T) == 8) {
    return f == 'q' || f == 'Q' || f == 'l' || f == 'L';
  }
  return false;
}

template <typename T>
ArrayView<T> View(const py::handle& object, const std::string& what, const char* expected) {
  if (!py::isinstance<py::buffer>(object)) {
    throw py::type_error(what + ": expected a buffer (numpy array) of " + expected +
                         ", received " + std::string(py::str(py::type::of(object))));
  }
  py::buffer_info info = py::reinterpret_borrow<py::buffer>(object).request();
  if (info.itemsize != static_cast<py::ssize_t>(sizeof(T)) || !KindMatches<T>(info.format)) {
    throw py::type_error(what + ": expected " + expected + ", received format '" + info.format +
                         "' of " + std::to_string(info.itemsize) + " bytes");
  }
  if (info.ndim > 1) {
    // [batch, dim] gradients are fine as long as they are C-contiguous.
    py::ssize_t stride = info.itemsize;
    for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
      if (info.shape[d] > 1 && info.strides[d] != stride) {
        throw py::type_error(what + ": expected a C-contiguous array; pass numpy.ascontiguousarray(x)");
      }
      stride *= info.shape[d];
    }
  } else if (info.ndim == 1 && info.shape[0] > 1 && info.strides[0] != info.itemsize) {
    throw py::type_error(what + ": expected a contiguous array; pass numpy.ascontiguousarray(x)");
  }
  return ArrayView<T>{std::move(info)};
}

class Client {
 public:
  Client(const std::vector<std::string>& shards, const std::string& inproc_checkpoint_dir,
         const std::string& inproc_restore_from, double rpc_timeout_s, double connect_timeout_s,
         double retry_budget_s, bool tls, const std::string& tls_ca, const std::string& tls_cert,
         const std::string& tls_key, const std::string& tls_server_name,
         const std::string& auth_token) {
    std::vector<const char*> addresses;
    for (const auto& s : shards) addresses.push_back(s.c_str());
    ember_client_options options{addresses.data(),
                                 addresses.size(),
                                 rpc_timeout_s,
                                 connect_timeout_s,
                                 retry_budget_s,
                                 tls ? 1 : 0,
                                 tls_ca.c_str(),
                                 tls_cert.c_str(),
                                 tls_key.c_str(),
                                 tls_server_name.c_str(),
                                 auth_token.c_str(),
                                 inproc_checkpoint_dir.c_str(),
                                 inproc_restore_from.c_str()};
    CallReleased([&] { return ember_client_connect(&options, &client_); });
  }
  ~Client() {
    py::gil_scoped_release release;
    ember_client_free(client_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  ember_client* get() const { return client_; }
  uint32_t shard_count() const { return ember_client_shard_count(client_); }

  void CreateTableJson(const std::string& json) {
    CallReleased([&] { return ember_client_create_table(client_, json.c_str()); });
  }
  std::string ListTablesJson() {
    char* out = nullptr;
    CallReleased([&] { return ember_client_list_tables(client_, &out); });
    return TakeString(out);
  }
  std::string ShardInfosJson() {
    char* out = nullptr;
    CallReleased([&] { return ember_client_shard_infos(client_, &out); });
    return TakeString(out);
  }
  uint64_t StoredRows(const std::string& table) {
    uint64_t rows = 0;
    CallReleased([&] { return ember_client_stored_rows(client_, table.c_str(), &rows); });
    return rows;
  }
  py::array_t<float> LookupRows(const std::string& table, const py::handle& keys, uint32_t dim,
                                bool read_only) {
    const auto view = View<uint64_t>(keys, "lookup_rows: keys", "uint64 or int64");
    py::array_t<float> out({static_cast<py::ssize_t>(view.size()), static_cast<py::ssize_t>(dim)});
    float* data = out.mutable_data();
    const size_t len = view.size() * dim;
    CallReleased([&] {
      return ember_client_lookup_rows(client_, table.c_str(), view.data(), view.size(), read_only,
                                      data, len);
    });
    return out;
  }
  std::string CheckpointJson(const std::string& options_json) {
    char* out = nullptr;
    CallReleased([&] { return ember_client_checkpoint(client_, options_json.c_str(), &out); });
    return TakeString(out);
  }

 private:
  ember_client* client_ = nullptr;
};

class StepMerger {
 public:
  StepMerger(Client& client, int ranks, uint32_t worker_id, int staleness, int64_t first_step,
             double timeout_s, bool early_fetch) {
    ember_merger_options options{ranks,      worker_id, staleness, first_step,
                                 timeout_s, !early_fetch};
    CallReleased([&] { return ember_merger_create(client.get(), &options, &merger_); });
  }
  ~StepMerger() {
    py::gil_scoped_release release;
    ember_merger_free(merger_);
  }
  StepMerger(const StepMerger&) = delete;
  StepMerger& operator=(const StepMerger&) = delete;

  py::dict Stats() const {
    ember_merger_stats s{};
    ember_merger_stats_get(merger_, &s);
    py::dict d;
    d["rounds"] = s.rounds;
    d["fetch_rounds"] = s.fetch_rounds;
    d["rank_keys"] = s.rank_keys;
    d["merged_keys"] = s.merged_keys;
    return d;
  }
  ember_merger* get() const { return merger_; }

 private:
  ember_merger* merger_ = nullptr;
};

// A rank's node transport (ember_transport): an all-to-all in Python
// (`all_to_all(blocks) -> blocks`, one bytes object per rank each way), or
// one of an in-process group (InProcessGroup). The callable runs on the
// pipeline's background thread, which takes the GIL for it.
class Transport {
 public:
  Transport(uint32_t rank, uint32_t size, py::function all_to_all)
      : rank_(rank), size_(size), all_to_all_(std::move(all_to_all)) {
    CallReleased([&] { return ember_transport_create(rank, size, &Call, this, &transport_); });
  }
  Transport(uint32_t rank, uint32_t size, ember_transport* in_process)
      : rank_(rank), size_(size), transport_(in_process) {}
  ~Transport() { ember_transport_free(transport_); }
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  static std::vector<std::unique_ptr<Transport>> InProcessGroup(uint32_t size) {
    std::vector<ember_transport*> handles(size);
    CallReleased([&] { return ember_transports_in_process(size, handles.data()); });
    std::vector<std::unique_ptr<Transport>> out;
    for (uint32_t r = 0; r < size; ++r) out.push_back(std::make_unique<Transport>(r, size, handles[r]));
    return out;
  }

  uint32_t rank() const { return rank_; }
  uint32_t size() const { return size_; }
  ember_transport* get() const { return transport_; }

 private:
  static int Call(void* user, uint32_t ranks, const uint8_t* const* send, const size_t* sizes,
                  ember_alltoall_recv* recv) {
    auto* self = static_cast<Transport*>(user);
    py::gil_scoped_acquire gil;
    try {
      py::list blocks(ranks);
      for (uint32_t r = 0; r < ranks; ++r) {
        blocks[r] = py::bytes(reinterpret_cast<const char*>(send[r]), sizes[r]);
      }
      const py::sequence got = self->all_to_all_(blocks);
      if (got.size() != ranks) {
        throw py::value_error("all_to_all returned " + std::to_string(got.size()) +
                              " blocks; expected " + std::to_string(ranks));
      }
      for (uint32_t r = 0; r < ranks; ++r) {
        const py::buffer_info b = py::buffer(got[r]).request();
        if (int code = ember_alltoall_recv_set(recv, r, static_cast<const uint8_t*>(b.ptr),
                                               static_cast<size_t>(b.size * b.itemsize));
            code != 0) {
          return code;
        }
      }
      return 0;
    } catch (const std::exception& e) {
      // torch.distributed failed (a peer gone, a timeout): the group is unusable.
      ember_alltoall_recv_fail(recv, e.what());
      return 14;  // UNAVAILABLE
    }
  }

  uint32_t rank_;
  uint32_t size_;
  py::function all_to_all_;
  ember_transport* transport_ = nullptr;
};

class StepPipeline {
 public:
  StepPipeline(Client& client, uint32_t worker_id,
               const std::vector<std::tuple<std::string, std::string, int>>& features,
               int staleness, int prefetch_depth, int64_t first_step, bool early_fetch,
               StepMerger* merger, int merger_rank, Transport* transport, bool node_one_worker) {
    std::vector<ember_feature_spec> specs;
    for (const auto& [name, table, combiner] : features) {
      specs.push_back({name.c_str(), table.c_str(), combiner});
      names_.push_back(name);
    }
    ember_pipeline_options options{worker_id,      specs.data(), specs.size(), staleness,
                                   prefetch_depth, first_step,   !early_fetch,
                                   merger == nullptr ? nullptr : merger->get(), merger_rank,
                                   transport == nullptr ? nullptr : transport->get(),
                                   node_one_worker ? 1 : 0};
    CallReleased([&] { return ember_pipeline_create(client.get(), &options, &pipeline_); });
    for (size_t f = 0; f < names_.size(); ++f) dims_.push_back(ember_pipeline_dim(pipeline_, f));
  }
  ~StepPipeline() {
    py::gil_scoped_release release;
    ember_pipeline_free(pipeline_);
  }
  StepPipeline(const StepPipeline&) = delete;
  StepPipeline& operator=(const StepPipeline&) = delete;

  // batch: a sequence with one entry per feature, in order, or a mapping from
  // feature name; each entry (offsets, keys) or (offsets, keys, weights).
  void Prefetch(int64_t step, const py::object& batch) {
    const size_t n = names_.size();
    std::vector<py::object> entries(n);
    if (py::isinstance<py::dict>(batch)) {
      const auto dict = py::reinterpret_borrow<py::dict>(batch);
      if (dict.size() != n) {
        throw py::value_error("prefetch(step " + std::to_string(step) + "): batch has " +
                              std::to_string(dict.size()) + " features; expected " +
                              std::to_string(n) + " (" + Names() + ")");
      }
      for (size_t f = 0; f < n; ++f) {
        if (!dict.contains(names_[f])) {
          throw py::key_error("prefetch(step " + std::to_string(step) + "): batch has no feature '" +
                              names_[f] + "'; expected " + Names());
        }
        entries[f] = dict[py::str(names_[f])];
      }
    } else {
      const auto seq = py::reinterpret_borrow<py::sequence>(batch);
      if (seq.size() != n) {
        throw py::value_error("prefetch(step " + std::to_string(step) + "): batch has " +
                              std::to_string(seq.size()) + " features; expected " +
                              std::to_string(n) + " (" + Names() + ")");
      }
      for (size_t f = 0; f < n; ++f) entries[f] = seq[f];
    }
    std::vector<ArrayView<int64_t>> offsets;
    std::vector<ArrayView<uint64_t>> keys;
    std::vector<ArrayView<float>> weights;
    std::vector<ember_feature_batch> features(n);
    offsets.reserve(n);
    keys.reserve(n);
    weights.reserve(n);
    for (size_t f = 0; f < n; ++f) {
      const auto entry = py::reinterpret_borrow<py::sequence>(entries[f]);
      const std::string what = "feature '" + names_[f] + "'";
      if (entry.size() != 2 && entry.size() != 3) {
        throw py::value_error(what + ": expected (offsets, keys) or (offsets, keys, weights), received " +
                              std::to_string(entry.size()) + " items");
      }
      offsets.push_back(View<int64_t>(entry[0], what + " offsets", "int64"));
      keys.push_back(View<uint64_t>(entry[1], what + " keys", "uint64 or int64"));
      ember_feature_batch& fb = features[f];
      fb.offsets = offsets.back().data();
      fb.num_offsets = offsets.back().size();
      fb.keys = keys.back().data();
      fb.num_keys = keys.back().size();
      if (entry.size() == 3 && !entry[2].is_none()) {
        weights.push_back(View<float>(entry[2], what + " weights", "float32"));
        fb.weights = weights.back().data();
        fb.num_weights = weights.back().size();
      }
    }
    CallReleased([&] { return ember_pipeline_prefetch(pipeline_, step, features.data(), n); });
  }

  // A step given in TorchRec's jagged layout (KeyedJaggedTensor): `values`
  // holds feature 0's ids of every example, then feature 1's, ...;
  // `lengths` (int64) has num_keys * batch entries; the pipeline's feature f
  // is the jagged key feature_index[f]. Offsets are computed here, so the
  // caller runs no per-feature Python.
  void PrefetchJagged(int64_t step, const py::handle& values, const py::handle& lengths,
                      const std::vector<int64_t>& feature_index, const py::object& weights) {
    const auto ids = View<uint64_t>(values, "values", "int64 or uint64");
    const auto lens = View<int64_t>(lengths, "lengths", "int64");
    std::optional<ArrayView<float>> w;
    if (!weights.is_none()) w = View<float>(weights, "weights", "float32");
    const size_t n = names_.size();
    if (feature_index.size() != n) {
      throw py::value_error("feature_index: expected one entry per pipeline feature (" +
                            std::to_string(n) + ")");
    }
    int64_t num_keys = 0;
    for (int64_t k : feature_index) num_keys = std::max(num_keys, k + 1);
    if (num_keys == 0 || lens.size() % static_cast<size_t>(num_keys) != 0) {
      throw py::value_error("lengths: " + std::to_string(lens.size()) +
                            " entries is not a multiple of the number of keys");
    }
    const size_t keys_total = static_cast<size_t>(num_keys);
    const size_t batch = lens.size() / keys_total;
    std::vector<size_t> start(keys_total + 1, 0);
    for (size_t k = 0; k < keys_total; ++k) {
      int64_t sum = 0;
      for (size_t i = 0; i < batch; ++i) {
        const int64_t l = lens.data()[k * batch + i];
        if (l < 0) throw py::value_error("lengths: negative entry " + std::to_string(l));
        sum += l;
      }
      start[k + 1] = start[k] + static_cast<size_t>(sum);
    }
    if (start[keys_total] != ids.size() || (w.has_value() && w->size() != ids.size())) {
      throw py::value_error("values (and weights): " + std::to_string(ids.size()) +
                            " entries; the lengths sum to " + std::to_string(start[keys_total]));
    }
    std::vector<std::vector<int64_t>> offsets(n, std::vector<int64_t>(batch + 1, 0));
    std::vector<ember_feature_batch> features(n);
    for (size_t f = 0; f < n; ++f) {
      const auto k = static_cast<size_t>(feature_index[f]);
      for (size_t i = 0; i < batch; ++i) offsets[f][i + 1] = offsets[f][i] + lens.data()[k * batch + i];
      features[f] = {offsets[f].data(), batch + 1, ids.data() + start[k], start[k + 1] - start[k],
                     w.has_value() ? w->data() + start[k] : nullptr,
                     w.has_value() ? start[k + 1] - start[k] : 0};
    }
    CallReleased([&] { return ember_pipeline_prefetch(pipeline_, step, features.data(), n); });
  }

  // Returns the pooled rows ([batch, dim] float32 per feature); with `out`
  // (one writable C-contiguous float32 buffer per feature) writes there
  // instead and returns `out`.
  py::object Wait(int64_t step, const py::object& out) {
    int64_t batch = 0;
    CallReleased([&] { return ember_pipeline_wait(pipeline_, step, &batch, nullptr, nullptr, 0); });
    const size_t n = names_.size();
    std::vector<float*> buffers(n);
    std::vector<size_t> lens(n);
    py::list result;
    if (out.is_none()) {
      for (size_t f = 0; f < n; ++f) {
        py::array_t<float> a({static_cast<py::ssize_t>(batch), static_cast<py::ssize_t>(dims_[f])});
        buffers[f] = a.mutable_data();
        lens[f] = static_cast<size_t>(a.size());
        result.append(std::move(a));
      }
    } else {
      const auto seq = py::reinterpret_borrow<py::sequence>(out);
      if (seq.size() != n) {
        throw py::value_error("wait(step " + std::to_string(step) + "): out has " +
                              std::to_string(seq.size()) + " buffers; expected " + std::to_string(n));
      }
      for (size_t f = 0; f < n; ++f) {
        py::buffer_info info = py::reinterpret_borrow<py::buffer>(seq[f]).request(true);
        if (info.itemsize != 4 || info.format != "f") {
          throw py::type_error("wait: out[" + std::to_string(f) + "]: expected float32, received format '" +
                               info.format + "'");
        }
        buffers[f] = static_cast<float*>(info.ptr);
        lens[f] = static_cast<size_t>(info.size);
        result.append(seq[f]);
      }
    }
    CallReleased([&] {
      return ember_pipeline_wait(pipeline_, step, &batch, buffers.data(), lens.data(), n);
    });
    return result;
  }

  void Push(int64_t step, const py::sequence& grads) {
    const size_t n = grads.size();
    std::vector<ArrayView<float>> views;
    views.reserve(n);
    std::vector<const float*> data(n);
    std::vector<size_t> lens(n);
    for (size_t f = 0; f < n; ++f) {
      views.push_back(View<float>(grads[f], "push: grads[" + std::to_string(f) + "]", "float32"));
      data[f] = views.back().data();
      lens[f] = views.back().size();
    }
    CallReleased([&] { return ember_pipeline_push(pipeline_, step, data.data(), lens.data(), n); });
  }

  // All features side by side: [batch, sum of dims] (ember_pipeline_wait_packed).
  py::object WaitPacked(int64_t step, const py::object& out) {
    int64_t batch = 0;
    CallReleased([&] { return ember_pipeline_wait_packed(pipeline_, step, &batch, nullptr, 0); });
    py::object result = out;
    float* data = nullptr;
    size_t len = 0;
    if (out.is_none()) {
      FloatArray a({static_cast<py::ssize_t>(batch), static_cast<py::ssize_t>(width())});
      data = a.mutable_data();
      len = static_cast<size_t>(a.size());
      result = std::move(a);
    } else {
      py::buffer_info info = py::reinterpret_borrow<py::buffer>(out).request(true);
      if (info.itemsize != 4 || info.format != "f") {
        throw py::type_error("wait_packed: out: expected float32, received format '" + info.format + "'");
      }
      data = static_cast<float*>(info.ptr);
      len = static_cast<size_t>(info.size);
    }
    CallReleased([&] { return ember_pipeline_wait_packed(pipeline_, step, &batch, data, len); });
    return result;
  }

  void PushPacked(int64_t step, const py::handle& grads) {
    const auto view = View<float>(grads, "push_packed: grads", "float32");
    CallReleased([&] { return ember_pipeline_push_packed(pipeline_, step, view.data(), view.size()); });
  }

  void Flush() { CallReleased([&] { return ember_pipeline_flush(pipeline_); }); }
  void Close() { CallReleased([&] { return ember_pipeline_close(pipeline_); }); }

  py::dict Stats() const {
    ember_pipeline_stats s{};
    ember_pipeline_stats_get(pipeline_, &s);
    py::dict d;
    d["steps_waited"] = s.steps_waited;
    d["steps_pushed"] = s.steps_pushed;
    d["wait_seconds"] = s.wait_seconds;
    d["max_wait_seconds"] = s.max_wait_seconds;
    d["keys"] = s.keys;
    d["unique_keys"] = s.unique_keys;
    d["bytes_sent"] = s.bytes_sent;
    d["bytes_received"] = s.bytes_received;
    d["steps_patched"] = s.steps_patched;
    d["rows_patched"] = s.rows_patched;
    d["patch_bytes"] = s.patch_bytes;
    d["steps_refetched"] = s.steps_refetched;
    d["rows_refetched"] = s.rows_refetched;
    d["keys_refetched"] = s.keys_refetched;
    return d;
  }

  const std::vector<uint32_t>& dims() const { return dims_; }
  size_t width() const {
    size_t w = 0;
    for (uint32_t d : dims_) w += d;
    return w;
  }
  const std::vector<std::string>& feature_names() const { return names_; }
  int prefetch_depth() const { return ember_pipeline_prefetch_depth(pipeline_); }
  uintptr_t handle() const { return reinterpret_cast<uintptr_t>(pipeline_); }

  // The baseline of bench/python_overhead.py: the loop a Python trainer runs
  // (prefetch t + 1, wait t, push t with zero gradients), in C++ over the
  // same C ABI, with no Python per step. `batches` as prefetch takes them,
  // cycled; steps first_step .. first_step + steps - 1, and first_step must
  // be the next step to prefetch. Returns seconds.
  double RunNativeLoop(const py::list& batches, int64_t first_step, int64_t steps) {
    const size_t n = names_.size();
    std::vector<std::vector<ArrayView<int64_t>>> offsets(batches.size());
    std::vector<std::vector<ArrayView<uint64_t>>> keys(batches.size());
    std::vector<std::vector<ember_feature_batch>> features(batches.size());
    for (size_t b = 0; b < batches.size(); ++b) {
      const auto seq = py::reinterpret_borrow<py::sequence>(batches[b]);
      for (size_t f = 0; f < n; ++f) {
        const auto entry = py::reinterpret_borrow<py::sequence>(seq[f]);
        offsets[b].push_back(View<int64_t>(entry[0], "offsets", "int64"));
        keys[b].push_back(View<uint64_t>(entry[1], "keys", "uint64 or int64"));
      }
      for (size_t f = 0; f < n; ++f) {
        features[b].push_back({offsets[b][f].data(), offsets[b][f].size(), keys[b][f].data(),
                               keys[b][f].size(), nullptr, 0});
      }
    }
    int code = 0;
    std::string message;
    double seconds = 0;
    {
      py::gil_scoped_release release;
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::vector<float>> rows(n), grads(n);
      std::vector<float*> out(n);
      std::vector<const float*> in(n);
      std::vector<size_t> lens(n);
      auto fail = [&](int c) { code = c; message = ember_last_error(); };
      const size_t nb = features.size();
      if ((code = ember_pipeline_prefetch(pipeline_, first_step, features[0].data(), n)) != 0) fail(code);
      for (int64_t t = first_step; code == 0 && t < first_step + steps; ++t) {
        if (t + 1 < first_step + steps &&
            (code = ember_pipeline_prefetch(pipeline_, t + 1,
                                            features[(t + 1 - first_step) % nb].data(), n)) != 0) {
          fail(code);
          break;
        }
        int64_t batch = 0;
        if ((code = ember_pipeline_wait(pipeline_, t, &batch, nullptr, nullptr, 0)) != 0) { fail(code); break; }
        for (size_t f = 0; f < n; ++f) {
          rows[f].resize(batch * dims_[f]);
          grads[f].assign(batch * dims_[f], 0.0f);
          out[f] = rows[f].data();
          in[f] = grads[f].data();
          lens[f] = rows[f].size();
        }
        if ((code = ember_pipeline_wait(pipeline_, t, &batch, out.data(), lens.data(), n)) != 0) { fail(code); break; }
        if ((code = ember_pipeline_push(pipeline_, t, in.data(), lens.data(), n)) != 0) { fail(code); break; }
      }
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (code != 0) Raise(code, message);
    return seconds;
  }

 private:
  std::string Names() const {
    std::string s;
    for (const auto& n : names_) s += (s.empty() ? "" : ", ") + n;
    return s;
  }

  ember_pipeline* pipeline_ = nullptr;
  std::vector<std::string> names_;
  std::vector<uint32_t> dims_;
};


int CombinerCode(const std::string& combiner) {
  if (combiner == "sum") return EMBER_COMBINER_SUM;
  if (combiner == "mean") return EMBER_COMBINER_MEAN;
  if (combiner == "sqrtn") return EMBER_COMBINER_SQRTN;
  throw py::value_error("combiner '" + combiner + "'; expected 'sum', 'mean' or 'sqrtn'");
}

const float* OptionalWeights(const std::optional<FloatArray>& weights, size_t num_ids) {
  if (!weights.has_value()) return nullptr;
  if (static_cast<size_t>(weights->size()) != num_ids) {
    throw py::value_error("weights: expected one per id (" + std::to_string(num_ids) +
                          "), received " + std::to_string(weights->size()));
  }
  return weights->data();
}

FloatArray PoolForward(const OffsetArray& offsets, const InverseArray& inverse, const FloatArray& rows,
                       const std::string& combiner, const std::optional<FloatArray>& weights) {
  if (rows.ndim() != 2) throw py::value_error("rows: expected [num_rows, dim]");
  const auto dim = static_cast<uint32_t>(rows.shape(1));
  FloatArray pooled({static_cast<py::ssize_t>(std::max<py::ssize_t>(offsets.size() - 1, 0)),
                     static_cast<py::ssize_t>(dim)});
  const int code = ember_pool_forward(offsets.data(), offsets.size(), inverse.data(), inverse.size(),
                                      OptionalWeights(weights, inverse.size()), CombinerCode(combiner),
                                      rows.data(), rows.shape(0), dim, pooled.mutable_data());
  if (code != 0) Raise(code, ember_last_error());
  return pooled;
}

FloatArray PoolBackward(const OffsetArray& offsets, const InverseArray& inverse,
                        const FloatArray& d_pooled, size_t num_rows, const std::string& combiner,
                        const std::optional<FloatArray>& weights) {
  if (d_pooled.ndim() != 2 || d_pooled.shape(0) != offsets.size() - 1) {
    throw py::value_error("d_pooled: expected [batch, dim] with batch = len(offsets) - 1");
  }
  const auto dim = static_cast<uint32_t>(d_pooled.shape(1));
  FloatArray d_rows({static_cast<py::ssize_t>(num_rows), static_cast<py::ssize_t>(dim)});
  const int code = ember_pool_backward(offsets.data(), offsets.size(), inverse.data(), inverse.size(),
                                       OptionalWeights(weights, inverse.size()), CombinerCode(combiner),
                                       d_pooled.data(), num_rows, dim, d_rows.mutable_data());
  if (code != 0) Raise(code, ember_last_error());
  return d_rows;
}

}  // namespace

PYBIND11_MODULE(_ember, m) {
  m.doc() = "Native binding of Ember's trainer library (use the ember package).";

  m.def("pool_forward", &PoolForward, py::arg("offsets"), py::arg("inverse"), py::arg("rows"),
        py::arg("combiner"), py::arg("weights") = py::none(),
        "Pools rows[inverse[j]] per example (the pipeline's own host pooling).");
  m.def("pool_backward", &PoolBackward, py::arg("offsets"), py::arg("inverse"), py::arg("d_pooled"),
        py::arg("num_rows"), py::arg("combiner"), py::arg("weights") = py::none(),
        "The gradient of pool_forward with respect to rows.");

  py::class_<Client>(m, "Client")
      .def(py::init<const std::vector<std::string>&, const std::string&, const std::string&, double,
                    double, double, bool, const std::string&, const std::string&,
                    const std::string&, const std::string&, const std::string&>(),
           py::arg("shards"), py::arg("inproc_checkpoint_dir"), py::arg("inproc_restore_from"),
           py::arg("rpc_timeout_s"), py::arg("connect_timeout_s"), py::arg("retry_budget_s"),
           py::arg("tls") = false, py::arg("tls_ca") = "", py::arg("tls_cert") = "",
           py::arg("tls_key") = "", py::arg("tls_server_name") = "", py::arg("auth_token") = "")
      .def_property_readonly("shard_count", &Client::shard_count)
      .def("_create_table_json", &Client::CreateTableJson)
      .def("_list_tables_json", &Client::ListTablesJson)
      .def("_shard_infos_json", &Client::ShardInfosJson)
      .def("stored_rows", &Client::StoredRows, py::arg("table"))
      .def("_lookup_rows", &Client::LookupRows)
      .def("_checkpoint_json", &Client::CheckpointJson);

  py::class_<StepMerger>(m, "StepMerger")
      .def(py::init<Client&, int, uint32_t, int, int64_t, double, bool>(), py::arg("client"),
           py::arg("ranks"), py::arg("worker_id"), py::arg("staleness"), py::arg("first_step"),
           py::arg("timeout_s"), py::arg("early_fetch"), py::keep_alive<1, 2>())
      .def("stats", &StepMerger::Stats);

  py::class_<Transport>(m, "Transport")
      .def(py::init<uint32_t, uint32_t, py::function>(), py::arg("rank"), py::arg("size"),
           py::arg("all_to_all"))
      .def_static("in_process_group", &Transport::InProcessGroup, py::arg("size"))
      .def_property_readonly("rank", &Transport::rank)
      .def_property_readonly("size", &Transport::size);

  // keep_alive: the client, the merger and the transport (None for none)
  // outlive the pipeline.
  py::class_<StepPipeline>(m, "StepPipeline")
      .def(py::init<Client&, uint32_t, const std::vector<std::tuple<std::string, std::string, int>>&,
                    int, int, int64_t, bool, StepMerger*, int, Transport*, bool>(),
           py::arg("client"), py::arg("worker_id"), py::arg("features"), py::arg("staleness"),
           py::arg("prefetch_depth"), py::arg("first_step"), py::arg("early_fetch") = true,
           py::arg("merger") = nullptr, py::arg("merger_rank") = 0,
           py::arg("transport") = nullptr, py::arg("node_one_worker") = false,
           py::keep_alive<1, 2>(), py::keep_alive<1, 9>(), py::keep_alive<1, 11>())
      .def("prefetch", &StepPipeline::Prefetch, py::arg("step"), py::arg("batch"))
      .def("wait", &StepPipeline::Wait, py::arg("step"), py::arg("out") = py::none())
      .def("prefetch_jagged", &StepPipeline::PrefetchJagged, py::arg("step"), py::arg("values"),
           py::arg("lengths"), py::arg("feature_index"), py::arg("weights") = py::none())
      .def("push", &StepPipeline::Push, py::arg("step"), py::arg("grads"))
      .def("wait_packed", &StepPipeline::WaitPacked, py::arg("step"), py::arg("out") = py::none())
      .def("push_packed", &StepPipeline::PushPacked, py::arg("step"), py::arg("grads"))
      .def("flush", &StepPipeline::Flush)
      .def("close", &StepPipeline::Close)
      .def("stats", &StepPipeline::Stats)
      .def_property_readonly("dims", &StepPipeline::dims)
      .def_property_readonly("feature_names", &StepPipeline::feature_names)
      .def_property_readonly("prefetch_depth", &StepPipeline::prefetch_depth)
      .def_property_readonly("_handle", &StepPipeline::handle)
      .def("_run_native_loop", &StepPipeline::RunNativeLoop, py::arg("batches"),
           py::arg("first_step"), py::arg("steps"));
}
