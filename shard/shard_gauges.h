// The shard's gauges (rows, capacity, memory and store counters per table,
// workers and their lag), filled from Shard's read API each time the
// registry is scraped.
#pragma once

#include "shard/shard.h"
#include "shard/shard_metrics.h"

namespace ember {

// Registers the scrape callback on metrics->registry(). `shard` and
// `metrics` must outlive the registry's scrapes.
void WatchShardGauges(const Shard* shard, ShardMetrics* metrics);

}  // namespace ember
