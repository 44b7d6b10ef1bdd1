#include "shard/shard_gauges.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"

namespace ember {

void WatchShardGauges(const Shard* shard, ShardMetrics* metrics) {
  const std::string device = shard->options().device.ToString();
  metrics->registry().OnScrape([shard, metrics, device] {
    // Dropped tables disappear from the gauges.
    for (auto* f : {&metrics->table_rows, &metrics->table_capacity, &metrics->table_memory}) {
      f->Clear();
    }
    for (auto* f : {&metrics->table_inserts, &metrics->table_evictions,
                    &metrics->table_insert_failures, &metrics->table_expired,
                    &metrics->table_admission_rejected, &metrics->table_admission_dropped}) {
      f->Clear();
    }
    for (const Shard::TableStats& t : shard->AllTableStats()) {
      const StoreStats& st = t.stats;
      const metrics::Labels labels = {t.name, device};
      metrics->table_rows.With(labels).Set(static_cast<double>(st.rows));
      metrics->table_capacity.With(labels).Set(static_cast<double>(st.capacity));
      metrics->table_memory.With(labels).Set(static_cast<double>(st.memory_bytes));
      metrics->table_inserts.With(labels).Mirror(static_cast<double>(st.inserts));
      metrics->table_evictions.With(labels).Mirror(static_cast<double>(st.evictions));
      metrics->table_insert_failures.With(labels).Mirror(static_cast<double>(st.insert_failures));
      metrics->table_expired.With(labels).Mirror(static_cast<double>(st.expired));
      metrics->table_admission_rejected.With(labels).Mirror(
          static_cast<double>(st.admission_rejected));
      metrics->table_admission_dropped.With(labels).Mirror(static_cast<double>(st.admission_dropped));
    }
    const std::map<uint32_t, int64_t> applied = shard->AppliedSteps();
    int64_t fastest = -1;
    for (const auto& [id, step] : applied) fastest = std::max(fastest, step);
    metrics->worker_lag.Clear();
    for (const auto& [id, step] : applied) {
      metrics->worker_lag.With({absl::StrCat(id)}).Set(static_cast<double>(fastest - step));
    }
    metrics->registered_workers.Set(static_cast<double>(applied.size()));
    metrics->routing_epoch.Set(static_cast<double>(shard->routing_epoch()));
  });
}

}  // namespace ember
