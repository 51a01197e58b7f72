#include "decode/history_reader.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace hybridserve::decode {

HistoryReader::HistoryReader(cachestore::CacheClient& cache, const cachestore::ModelNamespace& ns,
                             cachestore::CacheBackoff& backoff, const HistoryReaderOptions& options)
    : cache_(cache), namespace_(ns), backoff_(backoff), options_(options) {}

HistoryReader::PageViews HistoryReader::Views(const engine::SequenceTable& table,
                                              const engine::ImportReservation& reservation,
                                              const transport::Ticket& ticket) const {
  if (!transport::PlaneTakesHeldPages(ticket.kind) || ticket.num_pages == 0 ||
      ticket.num_pages * ticket.page_bytes < options_.min_bytes) {
    return {};
  }
  // UNIMPLEMENTED where the host cannot write the pool (a GPU): prefill sends every page.
  absl::StatusOr<PageViews> views = table.ImportPageHostViews(reservation.id, ticket.num_pages);
  return views.ok() ? *std::move(views) : PageViews();
}

int64_t HistoryReader::Read(const prefill::PrefillRequest& call, const PageViews& views) {
  if (views.empty() || backoff_.Skipping()) return 0;
  absl::StatusOr<cachestore::LookupResult> lookup = cache_.Lookup(
      namespace_.For(call.tenant, call.cache_salt, call.prompt), call.prompt, cachestore::LookupMode::kLease);
  const int64_t pages =
      lookup.ok() ? std::min<int64_t>(static_cast<int64_t>(lookup->pages.size()), static_cast<int64_t>(views.size()))
                  : 0;
  absl::Status read = lookup.status();
  if (pages > 0) {
    std::vector<common::Hash128> keys;
    std::vector<cachestore::EntrySegments> destinations(static_cast<size_t>(pages));
    keys.reserve(static_cast<size_t>(pages));
    for (int64_t i = 0; i < pages; ++i) {
      keys.push_back(lookup->pages[static_cast<size_t>(i)].key);
      destinations[static_cast<size_t>(i)].segments = views[static_cast<size_t>(i)];
    }
    // Split over streams: the first on this thread, the others on their own.
    const int64_t streams = std::min(pages, options_.streams);
    std::vector<absl::Status> results(static_cast<size_t>(streams));
    auto read_range = [&](int64_t s) {
      const int64_t begin = pages * s / streams, end = pages * (s + 1) / streams;
      results[static_cast<size_t>(s)] =
          cache_.GetManyScattered(lookup->lease_id, absl::MakeConstSpan(keys).subspan(begin, end - begin),
                                  absl::MakeConstSpan(destinations).subspan(begin, end - begin));
    };
    std::vector<std::thread> helpers;
    for (int64_t s = 1; s < streams; ++s) helpers.emplace_back(read_range, s);
    read_range(0);
    for (std::thread& t : helpers) t.join();
    for (const absl::Status& r : results) {
      if (read.ok() && !r.ok()) read = r;
    }
  }
  if (lookup.ok() && lookup->lease_id != 0) (void)cache_.Release(lookup->lease_id);
  {
    absl::MutexLock lock(&mu_);
    if (read.ok()) {
      if (pages > 0) ++counts_.reads;
      return pages;
    }
    ++counts_.failures;  // a miss: prefill sends every page (over what was written here)
  }
  backoff_.Note(read);
  int64_t held_back = 0;
  if (log_limiter_.Allow(absl::StrCat("history read ", common::FailureReason(read)), &held_back)) {
    LOG(WARNING) << "request " << call.request_id
                 << ": reading its prompt's cached pages failed, prefill sends them: " << read
                 << common::HeldBack(held_back);
  }
  return 0;
}

HistoryReader::Counts HistoryReader::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

}  // namespace hybridserve::decode
