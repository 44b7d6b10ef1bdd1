#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/dedup.h"
#include "client/early_fetch.h"
#include "client/internal/step_merger_impl.h"
#include "client/pooling.h"
#include "client/request_plan.h"
#include "common/status_macros.h"

namespace ember {
namespace internal {

// A fetched step, merged: per table the node's unique keys and, per rank,
// where each of the rank's unique keys sits among them.
struct StepMergerImpl::MergedStep {
  std::vector<std::vector<uint64_t>> keys;              // [table]
  std::vector<std::vector<std::vector<uint32_t>>> map;  // [rank][table][rank's key]
  RequestPlan plan;
};

StepMergerImpl::StepMergerImpl(Client* client, StepMergerOptions options)
    : client_(client), options_(std::move(options)), dedup_(std::make_unique<KeyDeduplicator>()) {
  parts_.assign(options_.ranks, nullptr);
  joined_.assign(options_.ranks, false);
  applied_upto_ = options_.first_step - 1;
}

absl::Status StepMergerImpl::Register() {
  if (options_.staleness < 0) return absl::OkStatus();
  EMBER_RETURN_IF_ERROR(client_->RegisterWorker(options_.worker_id, options_.first_step));
  registered_ = true;
  return absl::OkStatus();
}

StepMergerImpl::~StepMergerImpl() {
  if (registered_) (void)client_->UnregisterWorker(options_.worker_id);
}

StepMergerStats StepMergerImpl::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

absl::Status StepMergerImpl::Join(int rank, const std::vector<std::string>& tables,
                              const std::vector<uint32_t>& dims) {
  std::lock_guard<std::mutex> lock(mu_);
  if (rank < 0 || rank >= options_.ranks) {
    return absl::InvalidArgumentError(absl::StrCat("merger_rank: expected 0 .. ",
                                                   options_.ranks - 1, ", received ", rank));
  }
  if (joined_[rank]) {
    return absl::FailedPreconditionError(
        absl::StrCat("merger_rank ", rank, ": another pipeline has that rank already"));
  }
  if (tables_.empty()) {
    if (options_.early_fetch && options_.staleness == 0) {
      // How the shards hold the tables, for the trainer-side updates.
      EMBER_ASSIGN_OR_RETURN(std::vector<EarlyFetch::Table> described,
                             EarlyFetch::Describe(*client_, tables));
      early_ = std::make_unique<EarlyFetch>(std::move(described), options_.early_fetch_patch);
    }
    tables_ = tables;
    dims_ = dims;
  } else if (tables != tables_ || dims != dims_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "merger_rank ", rank, ": the ranks of a StepMerger must use the same tables in the same "
        "order; expected ", tables_.size(), " tables starting with '", tables_[0],
        "', received ", tables.size(), tables.empty() ? "" : absl::StrCat(" starting with '", tables[0], "'")));
  }
  joined_[rank] = true;
  return absl::OkStatus();
}

absl::Status StepMergerImpl::Merge(int rank, Part* part) {
  std::unique_lock<std::mutex> lock(mu_);
  EMBER_RETURN_IF_ERROR(failed_);
  parts_[rank] = part;
  ++arrived_;
  const uint64_t generation = generation_;
  if (arrived_ < options_.ranks) {
    SumArrived(lock);
    // The timeout is for the other ranks to arrive; once the round runs, its
    // RPCs have their own deadlines (and the leader writes into this part).
    const auto deadline = absl::ToChronoTime(absl::Now() + options_.timeout);
    while (generation_ == generation && failed_.ok()) {
      if (running_) {
        if (!DeliverShare(rank, lock)) cv_.wait(lock);
        continue;
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::no_timeout || running_ ||
          generation_ != generation || !failed_.ok()) {
        continue;
      }
      // Timed out: the round can never complete without the missing parts.
      std::string missing;
      for (int r = 0; r < options_.ranks; ++r) {
        if (parts_[r] == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", r);
      }
      failed_ = absl::DeadlineExceededError(absl::StrCat(
          "StepMerger: rank ", rank, " waited ", absl::FormatDuration(options_.timeout),
          " for rank(s) ", missing, " to reach the same exchange (the ranks must make the same "
          "calls in the same order)"));
      parts_.assign(options_.ranks, nullptr);
      arrived_ = 0;
      cv_.notify_all();
    }
    if (generation_ != generation) return round_status_;
    // Failed: a rank still summing reads the parts, this one's included.
    AwaitSummer(lock);
    return failed_;
  }
  // The last rank to arrive runs the round, once no rank is summing.
  std::vector<Part*> parts = parts_;
  running_ = true;
  AwaitSummer(lock);
  const int summed = summed_ranks_;
  lock.unlock();
  absl::Status status = RunRound(rank, parts, summed);
  lock.lock();
  running_ = false;
  round_status_ = status;
  parts_.assign(options_.ranks, nullptr);
  arrived_ = 0;
  summed_ranks_ = 0;
  ++generation_;
  cv_.notify_all();
  return status;
}

void StepMergerImpl::SumArrived(std::unique_lock<std::mutex>& lock) {
  // Only into requests prepared for this very push (PreparePush), which
  // the round then sends: the leader checks the ranks are in step.
  auto next = [&]() -> const Part* {
    if (summing_ || running_ || !failed_.ok() || summed_ranks_ >= options_.ranks) return nullptr;
    const Part* p = parts_[summed_ranks_];
    if (p == nullptr || !p->push_step || prepared_push_ != p->push_step) return nullptr;
    return p;
  };
  for (const Part* p = next(); p != nullptr; p = next()) {
    const int r = summed_ranks_;
    summing_ = true;
    lock.unlock();
    SumRank(r, *p);
    lock.lock();
    summing_ = false;
    ++summed_ranks_;
    ++stats_.ranks_summed_early;
  }
}

void StepMergerImpl::AwaitSummer(std::unique_lock<std::mutex>& lock) {
  // A summer is done within one rank's sums (microseconds): yield to it
  // rather than sleep and wait to be woken, which on a busy node costs
  // more than the sums.
  while (summing_) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
}

void StepMergerImpl::SumRank(int r, const Part& part) {
  const MergedStep& m = *steps_.at(*part.push_step);
  fresh_.resize(tables_.size());
  for (size_t tb = 0; tb < tables_.size(); ++tb) {
    // Every merged key is some rank's, so its first rank writes its row
    // and the later ones add to it: nothing is zeroed first.
    if (r == 0) fresh_[tb].assign(m.keys[tb].size(), 1);
    ScatterAddRows(m.map[r][tb], part.grads[tb], dims_[tb], sum_at_[tb].data(), fresh_[tb].data());
  }
}

absl::Status StepMergerImpl::CheckInStep(const std::vector<Part*>& parts) const {
  auto describe = [](const Part& p) {
    return absl::StrCat(p.push_step ? absl::StrCat("pushes step ", *p.push_step) : "pushes nothing",
                        " and ",
                        p.fetch_step ? absl::StrCat("fetches step ", *p.fetch_step)
                                     : "fetches nothing");
  };
  for (size_t r = 1; r < parts.size(); ++r) {
    if (parts[r]->push_step != parts[0]->push_step || parts[r]->fetch_step != parts[0]->fetch_step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "StepMerger: ranks out of step: rank 0 ", describe(*parts[0]), ", rank ", r, " ",
          describe(*parts[r]), " (the ranks must make the same calls in the same order)"));
    }
  }
  return absl::OkStatus();
}

absl::Status StepMergerImpl::RunRound(int leader, const std::vector<Part*>& parts, int summed) {
  EMBER_RETURN_IF_ERROR(CheckInStep(parts));
  const Part& first = *parts[0];
  const uint32_t shards = client_->shard_count();
  const int ranks = options_.ranks;
  // The push's requests with the places of its gradient sums: prepared by
  // the round before (off the critical path) when it knew this push's step.
  std::vector<v1::ExchangeRequest> requests;
  uint64_t sent = 0;
  if (first.push_step && prepared_push_ == *first.push_step) {
    requests = std::move(prepared_);
    sent = prepared_bytes_;
  } else {
    summed = 0;  // SumArrived sums into prepared requests only
    requests.assign(shards, v1::ExchangeRequest());
    if (first.push_step) {
      EMBER_ASSIGN_OR_RETURN(sent, PreparePush(*first.push_step, &requests));
    }
  }
  prepared_push_.reset();

  MergedStep* refetch = nullptr;  // the step after the push, fetched after it
  std::vector<const float*> peeked;  // its early-fetched rows
  if (first.push_step) {
    parts[leader]->sum_start = absl::Now();
    for (int r = summed; r < ranks; ++r) SumRank(r, *parts[r]);
    for (size_t tb = 0; tb < tables_.size(); ++tb) {
      for (size_t u = 0; u < fresh_[tb].size(); ++u) {  // none, by construction
        if (fresh_[tb][u]) memset(sum_at_[tb][u], 0, size_t{dims_[tb]} * sizeof(float));
      }
    }
    parts[leader]->sum_end = absl::Now();
    const int64_t next = *first.push_step + 1;
    if (early_ && early_->pending() == next) {
      EMBER_ASSIGN_OR_RETURN(const bool patched, PatchNext(leader, parts, next, &requests));
      if (!patched) {
        refetch = steps_.at(next).get();
        // Kept until the ranks have their rows (the next round's peek
        // reuses the memory).
        peeked = early_->PeekedRows();
      }
    }
  }
  MergedStep* fetch = nullptr;
  bool peek = false;
  if (first.fetch_step) {
    const int64_t f = *first.fetch_step;
    fetch = MergeFetch(parts);
    // Early: a peek unless the push before the fetched step is applied by now.
    peek = early_ && first.push_step != f - 1 && applied_upto_ < f - 1;
    if (peek) {
      early_->FillPeek(f, fetch->keys, fetch->plan, steps_.at(f - 1)->keys, options_.worker_id,
                       &requests);
    } else {
      sent += fetch->plan.FillLookups(f, clock_, &requests);
    }
  }
  if (first.push_step) steps_.erase(*first.push_step);
  if (!first.push_step && !first.fetch_step) return absl::OkStatus();

  std::vector<ExchangeAnswer>& responses = answers_;
  EMBER_RETURN_IF_ERROR(client_->Exchange(HandOver(&requests), &responses));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.rounds;
  }
  if (first.push_step) applied_upto_ = *first.push_step;
  uint64_t received = 0;
  if (peek) {
    EMBER_RETURN_IF_ERROR(early_->Receive(*first.fetch_step, fetch->plan, responses));
    for (Part* p : parts) p->peek_bytes = early_->peek_bytes() / ranks;
  }
  // The rows that came back: the fetched step's, or the refetched one's.
  if (refetch != nullptr) {
    EMBER_RETURN_IF_ERROR(HandOutRows(parts, *first.push_step + 1, *refetch, &peeked, &received));
  } else if (fetch != nullptr && !peek) {
    EMBER_RETURN_IF_ERROR(HandOutRows(parts, *first.fetch_step, *fetch, nullptr, &received));
  }
  for (Part* p : parts) {
    p->bytes_sent = sent / ranks;
    p->bytes_received = (received + (peek ? early_->peek_bytes() : 0)) / ranks;
  }
  // The next push is the oldest fetched step's: its requests now, while
  // the trainers compute, rather than after its last rank has pushed.
  if (!steps_.empty()) {
    prepared_.assign(shards, v1::ExchangeRequest());
    EMBER_ASSIGN_OR_RETURN(prepared_bytes_, PreparePush(steps_.begin()->first, &prepared_));
    prepared_push_ = steps_.begin()->first;
  }
  return absl::OkStatus();
}

StepMergerImpl::MergedStep* StepMergerImpl::MergeFetch(const std::vector<Part*>& parts) {
  const size_t tables = tables_.size();
  const int ranks = options_.ranks;
  auto merged = std::make_unique<MergedStep>();
  merged->keys.resize(tables);
  merged->map.assign(ranks, std::vector<std::vector<uint32_t>>(tables));
  uint64_t rank_keys = 0;
  for (size_t tb = 0; tb < tables; ++tb) {
    dedup_->Clear();
    for (int r = 0; r < ranks; ++r) {
      const std::vector<uint64_t>& keys = (*parts[r]->keys)[tb];
      rank_keys += keys.size();
      dedup_->Add(keys, &merged->map[r][tb]);
    }
    merged->keys[tb] = dedup_->unique();
  }
  merged->plan.Route(*client_, tables_, dims_, merged->keys);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.fetch_rounds;
    stats_.rank_keys += rank_keys;
    stats_.merged_keys += merged->plan.keys();
  }
  MergedStep* step = merged.get();
  steps_[*parts[0]->fetch_step] = std::move(merged);
  return step;
}

absl::Status StepMergerImpl::HandOutRows(const std::vector<Part*>& parts, int64_t step,
                                         const MergedStep& with_rows,
                                         const std::vector<const float*>* peeked,
                                         uint64_t* received) {
  const size_t tables = tables_.size();
  const int ranks = options_.ranks;
  // Each rank's rows, in its own key order, by address: where they
  // arrived in the answers (or, refetched, as peeked where unchanged), or,
  // below copy_rows_below_bytes, in a block of the rank's own. Each rank
  // pools from there.
  uint64_t rows = 0;
  EMBER_RETURN_IF_ERROR(
      with_rows.plan.CollectRowAddresses(answers_, peeked, &row_at_, received, &rows));
  rank_rows_.resize(ranks);
  for (int r = 0; r < ranks; ++r) {
    Part& part = *parts[r];
    part.rows_step = step;
    part.refetched = peeked != nullptr;
    if (part.refetched) {
      part.refetched_rows = rows;
      part.refetched_keys = with_rows.plan.keys();
    }
    part.rows_at.resize(tables);
    rank_rows_[r].resize(tables);
    for (size_t tb = 0; tb < tables; ++tb) {
      const std::vector<uint32_t>& map = with_rows.map[r][tb];
      std::vector<const char*>& at = part.rows_at[tb];
      at.resize(map.size());
      const size_t row_bytes = size_t{dims_[tb]} * sizeof(float);
      if (row_bytes >= options_.copy_rows_below_bytes) {
        for (size_t u = 0; u < map.size(); ++u) at[u] = row_at_[tb][map[u]];
        continue;
      }
      std::vector<char>& copy = rank_rows_[r][tb];
      copy.resize(map.size() * row_bytes);
      for (size_t u = 0; u < map.size(); ++u) {
        memcpy(copy.data() + u * row_bytes, row_at_[tb][map[u]], row_bytes);
        at[u] = copy.data() + u * row_bytes;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> StepMergerImpl::PreparePush(int64_t step,
                                                     std::vector<v1::ExchangeRequest>* requests) {
  auto it = steps_.find(step);
  if (it == steps_.end()) {
    return absl::InternalError(
        absl::StrCat("StepMerger: push of step ", step, " that was never fetched"));
  }
  const MergedStep& m = *it->second;
  sum_at_.resize(tables_.size());
  for (size_t tb = 0; tb < tables_.size(); ++tb) sum_at_[tb].resize(m.keys[tb].size());
  uint64_t bytes = 0;
  for (uint32_t sh = 0; sh < requests->size(); ++sh) {
    v1::PushRequest* p = (*requests)[sh].mutable_push();
    p->set_worker_id(options_.worker_id);
    p->set_step(step);
    bytes += m.plan.FillPushInPlace(sh, p, &sum_at_);
  }
  return bytes;
}

absl::StatusOr<bool> StepMergerImpl::PatchNext(int leader, const std::vector<Part*>& parts,
                                               int64_t step,
                                               std::vector<v1::ExchangeRequest>* requests) {
  MergedStep& next = *steps_.at(step);
  const bool patched = early_->Patchable();
  if (patched) {
    const absl::Time start = absl::Now();
    EMBER_ASSIGN_OR_RETURN(std::vector<const float*> rows, early_->Patch(sum_at_));
    parts[leader]->update_start = start;
    parts[leader]->update_end = absl::Now();
    // Each rank's rows are delivered (pooled into its pipeline) by
    // whichever thread of the round claims it first: the leader and the
    // ranks' threads waiting in Merge, which are woken for it. On two
    // cores, two deliver at once; the exchange goes out once all are done.
    std::unique_lock<std::mutex> lock(mu_);
    delivery_ = std::make_unique<Delivery>();
    delivery_->step = step;
    delivery_->rows = std::move(rows);
    delivery_->rows_patched = early_->rows_patched();
    delivery_->start = start;
    delivery_->next = &next;
    delivery_->parts = parts;
    delivery_->claimed.assign(parts.size(), false);
    cv_.notify_all();
    while (DeliverShare(leader, lock)) {
    }
    cv_.wait(lock, [&] { return delivery_->done == static_cast<int>(parts.size()); });
    const absl::Status status = delivery_->status;
    delivery_.reset();
    lock.unlock();
    EMBER_RETURN_IF_ERROR(status);
    // The trainers just woken come first: on a busy core they would
    // otherwise wait for this thread to build and send the exchange.
    std::this_thread::yield();
  }
  // The lookup's effects (inserts of the keys the peek found absent) or, to
  // refetch, its rows changed since the peek, after the push, as plain s = 0
  // has them.
  early_->FillAfterPush(step, patched, next.plan, clock_, requests);
  return patched;
}

bool StepMergerImpl::DeliverShare(int rank, std::unique_lock<std::mutex>& lock) {
  if (delivery_ == nullptr || delivery_->unclaimed() == 0) return false;
  Delivery& d = *delivery_;
  int r = rank;
  while (d.claimed[r]) r = (r + 1) % static_cast<int>(d.claimed.size());
  d.claimed[r] = true;
  lock.unlock();
  Part& part = *d.parts[r];
  part.patched_at.resize(tables_.size());
  for (size_t tb = 0; tb < tables_.size(); ++tb) {
    const std::vector<uint32_t>& map = d.next->map[r][tb];
    std::vector<const char*>& at = part.patched_at[tb];
    at.resize(map.size());
    for (size_t u = 0; u < map.size(); ++u) {
      at[u] = reinterpret_cast<const char*>(d.rows[tb] + size_t{map[u]} * dims_[tb]);
    }
  }
  absl::Status status = part.on_patched(d.step, d.rows_patched, d.start);
  lock.lock();
  if (d.status.ok()) d.status = std::move(status);
  if (++d.done == static_cast<int>(d.claimed.size())) cv_.notify_all();
  return true;
}

StepMergerImpl* MergerImpl(StepMerger* merger) { return merger->impl_.get(); }

}  // namespace internal

StepMerger::StepMerger(std::unique_ptr<internal::StepMergerImpl> impl) : impl_(std::move(impl)) {}

StepMerger::~StepMerger() = default;

absl::StatusOr<std::unique_ptr<StepMerger>> StepMerger::Create(Client* client,
                                                               StepMergerOptions options) {
  if (options.ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("StepMerger ranks: expected >= 1, received ", options.ranks));
  }
  if (options.first_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("StepMerger first_step: expected >= 0, received ", options.first_step));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("StepMerger timeout: expected > 0, received ",
                                                   absl::FormatDuration(options.timeout)));
  }
  auto impl = std::make_unique<internal::StepMergerImpl>(client, std::move(options));
  EMBER_RETURN_IF_ERROR(impl->Register());
  return std::unique_ptr<StepMerger>(new StepMerger(std::move(impl)));
}

const StepMergerOptions& StepMerger::options() const { return impl_->options(); }

StepMergerStats StepMerger::Stats() const { return impl_->Stats(); }

}  // namespace ember
