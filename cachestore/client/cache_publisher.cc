#include "cachestore/client/cache_publisher.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace hybridserve::cachestore {

// A publication and how far its puts have got.
struct CachePublisher::Job {
  Publication p;
  PublicationResult result;
  bool started = false;
  // The next put: pages in order, then the states.
  size_t next = 0;
  // The first page that failed (its index in the sequence); states that hang
  // at or below it are not tried.
  std::optional<int64_t> failed_page;
  // Waiting for another writer's parent page: until parent_deadline, the
  // next try at retry_at.
  absl::Time parent_deadline = absl::InfiniteFuture();
  absl::Time retry_at = absl::InfinitePast();
  absl::Duration backoff = absl::Milliseconds(1);
  bool other_writer = false;     // a page put came back ABORTED
  bool awaiting_parent = false;  // parked on FAILED_PRECONDITION: the next try puts that page alone
};

absl::StatusOr<std::unique_ptr<CachePublisher>> CachePublisher::Create(CacheClient& cache,
                                                                       const PublisherOptions& options) {
  if (options.max_queued < 1 || options.max_in_flight < 0 || options.parent_wait < absl::ZeroDuration() ||
      options.cache_failure_backoff < absl::ZeroDuration() || options.max_put_many_bytes < 0 ||
      options.put_many_recheck < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "cache publisher: max_queued >= 1, max_in_flight >= 0, parent_wait >= 0, cache_failure_backoff >= 0 and "
        "max_put_many_bytes >= 0, put_many_recheck >= 0");
  }
  std::unique_ptr<CachePublisher> publisher(new CachePublisher(cache, options));
  publisher->thread_ = std::thread([p = publisher.get()] { p->Run(); });
  return publisher;
}

CachePublisher::CachePublisher(CacheClient& cache, const PublisherOptions& options)
    : cache_(cache),
      options_(options),
      backoff_(options.backoff != nullptr ? options.backoff
                                          : std::make_shared<CacheBackoff>(options.cache_failure_backoff)) {}

CachePublisher::~CachePublisher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;  // after the publications already queued
  }
  if (thread_.joinable()) thread_.join();
}

void CachePublisher::Publish(Publication p) {
  auto job = std::make_unique<Job>();
  job->p = std::move(p);
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t queued = static_cast<int64_t>(queue_.size());
    return queued < options_.max_queued && (options_.max_in_flight == 0 || queued + held_ < options_.max_in_flight);
  };
  mu_.Await(absl::Condition(&room));
  queue_.push_back(std::move(job));
}

PublicationResult CachePublisher::PublishNow(Publication p) {
  Job job;
  job.p = std::move(p);
  while (!Step(job)) absl::SleepFor(std::max(absl::ZeroDuration(), job.retry_at - absl::Now()));
  PublicationResult result = job.result;
  Finish(job);
  return result;
}

bool CachePublisher::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && held_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

int64_t CachePublisher::in_flight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size()) + held_;
}

PublisherCounters CachePublisher::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

bool CachePublisher::stopping() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

void CachePublisher::Fail(Job& job, const absl::Status& status, absl::string_view what) {
  const std::string reason = common::FailureReason(status);
  {
    absl::MutexLock lock(&mu_);
    ++counters_.failures;
    ++counters_.failures_by_reason[reason];
  }
  if (!job.result.failure.empty()) return;
  job.result.failure = reason;
  job.result.failure_message = std::string(status.message());
  int64_t held_back = 0;
  if (log_limiter_.Allow(absl::StrCat("publication ", reason), &held_back)) {
    LOG(WARNING) << "cache publication of " << what << " failed: " << status << common::HeldBack(held_back);
  }
}

bool CachePublisher::Step(Job& job) {
  Publication& p = job.p;
  PublicationResult& result = job.result;
  const absl::Status skipped =
      absl::UnavailableError("the cachestore did not answer lately: publications skip it for a moment");
  if (!job.started) {
    job.started = true;
    result.states.resize(p.states.size());
    if (backoff_->Skipping()) {
      Fail(job, skipped, "a publication");
      return true;
    }
    if (p.probe_first && !p.pages.empty()) {
      // Which of the pages (all of them, from page 0) the cache lacks.
      std::vector<TokenId> fed;
      for (const auto& [put, bytes] : p.pages) fed.insert(fed.end(), put.tokens.begin(), put.tokens.end());
      absl::StatusOr<LookupResult> probe = cache_.Lookup(p.ns, fed, LookupMode::kProbeOnly);
      if (backoff_->Note(probe.status())) {
        Fail(job, probe.status(), "a probe");
        return true;
      }
      if (probe.ok()) {
        job.next = std::min(p.pages.size(), static_cast<size_t>(probe->kv_match_tokens / p.ns.page_size));
        for (size_t i = 0; i < job.next; ++i) std::string().swap(p.pages[i].second);  // present: free the copy
      }
    }
  }
  const size_t total = p.pages.size() + p.states.size();
  // After a failed page, the pages after it and the states below it have no
  // parent: they are not put, and their answers in a call that carried them
  // (FAILED_PRECONDITION) are not failures of their own.
  auto hangs_below_failure = [&](size_t i) {
    if (!job.failed_page.has_value()) return false;
    return i < p.pages.size() || p.states[i - p.pages.size()].first.position / p.ns.page_size > *job.failed_page;
  };
  while (job.next < total) {
    if (hangs_below_failure(job.next)) {
      ++job.next;
      continue;
    }
    // The entries from job.next, pages then states, in one PutMany of up to
    // max_put_many_bytes; while waiting for another writer's parent, the
    // waited-for entry alone.
    std::vector<PutManyEntry> batch;
    int64_t batch_bytes = 0;
    for (size_t i = job.next; i < total && !hangs_below_failure(i); ++i) {
      const auto& [what, bytes] = i < p.pages.size() ? p.pages[i] : p.states[i - p.pages.size()];
      const int64_t size = static_cast<int64_t>(bytes.size());
      if (!batch.empty() && (job.awaiting_parent || batch_bytes + size > options_.max_put_many_bytes)) break;
      batch.push_back({&what, bytes});
      batch_bytes += size;
    }
    std::vector<absl::StatusOr<PutResult>> results =
        backoff_->Skipping() ? std::vector<absl::StatusOr<PutResult>>(1, skipped) : PutBatch(p.ns, batch);
    for (const absl::StatusOr<PutResult>& r : results) {
      if (hangs_below_failure(job.next)) {
        ++job.next;  // it hung from a page that failed earlier in this call
        continue;
      }
      if (!Apply(job, r)) return false;  // parked at this entry: the batch is put again from it
    }
  }
  return true;
}

std::vector<absl::StatusOr<PutResult>> CachePublisher::PutBatch(const ClientNamespace& ns,
                                                                absl::Span<const PutManyEntry> entries) {
  const int64_t now = absl::ToUnixNanos(absl::Now());
  if (now >= put_many_unimplemented_until_.load(std::memory_order_relaxed)) {
    std::vector<absl::StatusOr<PutResult>> results = cache_.PutMany(ns, entries);
    if (results.empty() || results[0].status().code() != absl::StatusCode::kUnimplemented) {
      if (put_many_unimplemented_until_.exchange(0) != 0) LOG(INFO) << "the cachestore implements PutMany again";
      return results;
    }
    // A cachestore older than PutMany: nothing of the call was stored.
    if (put_many_unimplemented_until_.exchange(now + absl::ToInt64Nanoseconds(options_.put_many_recheck)) == 0) {
      LOG(WARNING) << "the cachestore does not implement PutMany (" << results[0].status()
                   << "): publications put each page with its own Put, asking again every "
                   << options_.put_many_recheck;
    }
  }
  return cache_.CacheClient::PutMany(ns, entries);  // Put for each
}

bool CachePublisher::Apply(Job& job, const absl::StatusOr<PutResult>& r) {
  Publication& p = job.p;
  PublicationResult& result = job.result;
  const bool is_page = job.next < p.pages.size();
  const size_t index = is_page ? job.next : job.next - p.pages.size();
  const ClientPut& what = is_page ? p.pages[index].first : p.states[index].first;
  const int64_t page = p.first_page + static_cast<int64_t>(index);
  backoff_->Note(r.status());
  if (r.ok()) {
    absl::MutexLock lock(&mu_);
    if (is_page) {
      if (!r->already_present) ++result.pages_put, ++counters_.pages_published;
    } else {
      if (!r->already_present) ++counters_.states_published;
      result.states[index] = *r;
    }
    ++job.next;
    job.backoff = absl::Milliseconds(1);
    job.awaiting_parent = false;
    return true;
  }
  if (is_page && r.status().code() == absl::StatusCode::kAborted) {
    job.other_writer = true;
    ++job.next;
    return true;
  }
  const bool parent_expected = p.parent_from_other_writer || job.other_writer;
  // Another writer's put of this very state is in flight (ABORTED): a turn
  // end at the prompt's end is the state prefill publishes there. Waited out
  // as a parent is: put again once that put has landed, it finds the state
  // present, and this publication's retention applies to it.
  const bool wait_for_other_writer = (r.status().code() == absl::StatusCode::kFailedPrecondition && parent_expected) ||
                                     (!is_page && r.status().code() == absl::StatusCode::kAborted);
  if (wait_for_other_writer) {
    const bool stop = stopping();
    const absl::Time now = absl::Now();
    if (job.parent_deadline == absl::InfiniteFuture()) job.parent_deadline = now + options_.parent_wait;
    if (!stop && now + job.backoff <= job.parent_deadline) {
      job.retry_at = now + job.backoff;
      job.backoff = std::min(2 * job.backoff, absl::Milliseconds(50));
      job.awaiting_parent = true;
      return false;
    }
    if (!stop && result.failure.empty()) {
      result.parent_wait_expired = true;
      absl::MutexLock lock(&mu_);
      ++counters_.parent_waits_expired;
    }
  }
  Fail(job, r.status(), is_page ? absl::StrCat("page ", page) : absl::StrCat("the state at ", what.position));
  if (is_page) job.failed_page = page;
  ++job.next;
  return true;
}

void CachePublisher::Finish(Job& job) {
  if (job.p.done) job.p.done(std::move(job.result));
}

void CachePublisher::Run() {
  // Publications waiting for a parent page, by when to try again.
  std::vector<std::unique_ptr<Job>> parked;
  auto finish = [this](std::unique_ptr<Job> job) {
    Finish(*job);
    absl::MutexLock lock(&mu_);
    --held_;
  };
  while (true) {
    std::unique_ptr<Job> job;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stop_; };
      absl::Time due = absl::InfiniteFuture();
      for (const auto& q : parked) due = std::min(due, q->retry_at);
      mu_.AwaitWithDeadline(absl::Condition(&ready), due);
      if (!queue_.empty()) {
        job = std::move(queue_.front());
        queue_.pop_front();
        ++held_;
      } else if (stop_ && parked.empty()) {
        return;  // stopping, and nothing left
      }
      stop = stop_;
    }
    if (job != nullptr) {
      if (Step(*job)) {
        finish(std::move(job));
      } else {
        parked.push_back(std::move(job));
      }
    }
    // The parked publications that are due (all of them when stopping: Step
    // then gives up at once).
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < parked.size();) {
      if (!stop && parked[i]->retry_at > now) {
        ++i;
        continue;
      }
      if (Step(*parked[i])) {
        finish(std::move(parked[i]));
        parked.erase(parked.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
}

}  // namespace hybridserve::cachestore
