#ifndef HYBRIDSERVE_DECODE_DECODE_LOOP_H_
#define HYBRIDSERVE_DECODE_DECODE_LOOP_H_

// The decode worker's core, below its gRPC edge (docs/ARCHITECTURE.md section 3, steps
// 2 and 4): admission, the prefill call with a transfer ticket, the import of
// the pushed state, continuous batching, streaming, stop conditions, and the
// publication of the turn-end state to the cache.
//
// One thread (the loop) owns the engine: it admits waiting requests when the
// engine has room for them (a state slot, and KV pages for the prompt plus
// max_tokens, reserved up front so a running request never runs out), starts
// their prefill calls (each on its own thread: a blocking call to a peer),
// imports the states that arrive, and runs one decode step over every running
// sequence at a time; sequences join and leave the batch between steps.
// Tokens are handed to the request's sink as they are sampled.
//
// A request ends, with exactly one OnComplete, on a stop condition (EOS
// unless ignore_eos, a stop id, a stop sequence: kStop; max_tokens: kLength),
// on Abort or its deadline (kAborted), or on an error (kError: prefill or the
// transfer failed and the fallback prefill was off, not allowed or failed
// too; DecodeLoopOptions::fallback_prefill_max_tokens). Every reservation it held is freed by then. A request
// that ends while prefilling cancels its prefill call; until that call
// returns it keeps a place in the batch (Counts::orphaned_calls), so the
// prefill pool never holds more than max_batch calls of this loop. On a normal
// end the turn-end state (the state after the last token fed to the model,
// with the logits that chose the last token) and the pages of the generated
// tokens are published to the cache before OnComplete, so the client's next
// turn, whose prompt extends this one, finds them (decode/turn_end.h): the
// loop thread only copies those bytes out, so the running batch never waits
// for the cache.
//
// Thread-safe: Submit and Abort may be called from any thread.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/cache_backoff.h"
#include "cachestore/model_namespace.h"
#include "common/hash.h"
#include "common/log_rate_limiter.h"
#include "decode/generation.h"
#include "decode/history_reader.h"
#include "decode/local_prefill.h"
#include "decode/turn_end.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "prefill/prefill_client.h"
#include "transport/transfer.h"

namespace hybridserve::decode {

struct DecodeLoopOptions {
  int64_t max_batch = 8;     // running sequences (decoding or being prefilled)
  int64_t max_waiting = 32;  // admitted requests waiting for room; beyond: RESOURCE_EXHAUSTED
  std::string endpoint;      // this worker's data-plane endpoint, put on tickets
  absl::Duration transfer_timeout = absl::Seconds(60);  // bounds a ticket's deadline
  std::vector<TokenId> eos_token_ids;
  std::string adapter;  // namespace part for publications
  bool publish = true;  // publish turn-end states and generated pages
  // When prefill publishes the prompt's pages (PrefillOutcome::publishes_prompt), the turn-end
  // publication hangs its pages under the prompt's last page: it waits at
  // most this long for prefill to have put that page, then gives up (the next
  // turn still resumes from prefill's prompt-end state). Publications wait
  // side by side: one waiting delays no other.
  absl::Duration publish_parent_wait = absl::Seconds(2);
  // After a cache call of a publication fails with DEADLINE_EXCEEDED (the
  // cachestore hung until cache_timeout), the publications of the next
  // cache_failure_backoff are skipped without a call (failure "unavailable"):
  // a hung cache costs one timeout per backoff, not one per request, and its
  // queue never backs up into the batch. A cachestore that is down refuses at
  // once (UNAVAILABLE) and is not skipped: its return is seen at once.
  absl::Duration cache_failure_backoff = absl::Seconds(1);
  // The process's one memory of a hung cache (cachestore/client/cache_backoff.h),
  // shared by the publisher, the history reads and the local prefill's
  // probe, and by any other cache user of the process given it. Null: the
  // loop makes one of cache_failure_backoff.
  std::shared_ptr<cachestore::CacheBackoff> cache_backoff;
  // Reads the prompt's cached pages (decode/history_reader.h) from the cache
  // into the reservation itself, on the prefill call's thread before the call, and asks prefill
  // to send only the pages after them (transport/transfer.h "Held pages").
  // Worth it where the cache client reads by shared memory (a cachestore on
  // this host: a 64 MiB history lands in ~10 ms instead of ~25 ms over the
  // TCP plane); over gRPC the push is the faster path. Applies with a cache,
  // a TCP or in-process plane and a pool the host can write; any failure
  // is a miss (prefill sends every page), and one that timed out skips the
  // reads of the next cache_failure_backoff.
  bool read_history_pages = false;
  // Only for prompts whose full pages hold at least this many bytes: below,
  // the lookup and lease (~1.3 ms on one host) cost more than the push they
  // save (~0.4 ms per MiB over the TCP plane). >= 0.
  int64_t history_read_min_bytes = int64_t{4} << 20;
  // Cache reads in flight while reading them (>= 1).
  int64_t history_read_streams = 2;
  // Local prefill (decode/local_prefill.h; with a KeepingPrefill given to Create and a cache): a
  // request whose prompt the cache holds a state of, all but at most this
  // many tokens (a conversation's next turn), is prefilled in this worker's
  // engine, on the loop thread, instead of by a call to the prefill pool: the
  // history is read once, into the sequence that then decodes, and nothing
  // crosses a data plane. The same resume, compute, sampling and
  // publication as a prefill worker's (PrefillWorker::PrefillAndKeep), so
  // the same bits. Any failure of it sends the request to the prefill pool.
  // 0: never.
  int64_t local_prefill_max_tokens = 0;
  // Whether a local prefill may run while other requests decode: they wait
  // for it (it takes the place of their next step). Off: only when none is
  // decoding, so a local prefill never delays another request's tokens.
  bool local_prefill_while_decoding = false;
  // Fallback prefill (with a KeepingPrefill given to Create; a cache is not
  // needed): a request whose prefill call failed (no prefill worker answered
  // within the pool's unavailable wait, or the worker failed or died during
  // the call, or the pushed state could not be imported) is prefilled in
  // this worker's engine, on the loop thread, when its prompt has at most
  // this many tokens: the same PrefillWorker::PrefillAndKeep as the local
  // prefill, so the same bits as the pool's path, first turn or
  // continuation. Once per request (a failed fallback ends it with
  // kError); never for a call refused for its input (INVALID_ARGUMENT,
  // OUT_OF_RANGE). No token has been streamed before a prefill call
  // returns, so a retry is never seen by the client. The next request goes
  // to the pool again, but while calls fail it does not wait for an
  // unreachable pool to come back (PrefillRequest::skip_unavailable_wait):
  // only the first call to find the pool gone pays its unavailable wait. A
  // longer prompt ends with the pool's error, its message naming the limit.
  // 0: never (the pool's error ends the request).
  int64_t fallback_prefill_max_tokens = 0;
};

class DecodeLoop {
 public:
  // `model`, `prefill`, `receiver` and `cache` (null: no cache) must outlive
  // the loop; `local_prefill` (may be empty) runs on the loop thread, in
  // `model`, for the local prefill (with a cache) and the fallback prefill.
  // INVALID_ARGUMENT for non-positive sizes.
  static absl::StatusOr<std::unique_ptr<DecodeLoop>> Create(
      engine::Model& model, const common::Hash128& model_fingerprint, prefill::PrefillClient& prefill,
      transport::StateReceiver& receiver, cachestore::CacheClient* cache, const DecodeLoopOptions& options,
      KeepingPrefill local_prefill = nullptr);
  // Aborts every request still running (each gets its OnComplete) and joins
  // every thread.
  ~DecodeLoop();

  // Takes a request; its tokens and completion go to `sink`, which must live
  // until OnComplete. The loop knows it by its id within its tenant
  // (ScopedRequestId(request.tenant, request.request_id)): tenants' ids never
  // collide, and what a caller is told names the client's id only.
  // INVALID_ARGUMENT for a bad field (ValidateRequest) or a request id already
  // live in the tenant; RESOURCE_EXHAUSTED when the wait queue is full or
  // the request could never fit the engine; UNAVAILABLE while draining. On
  // error the sink is never called.
  absl::Status Submit(GenerateRequest request, GenerationSink* sink) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends `tenant`'s live request `request_id` with kAborted within one decode
  // step; false when that tenant has no such request live.
  bool Abort(absl::string_view tenant, absl::string_view request_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses new requests (UNAVAILABLE); running ones finish.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

  // The longest prompt + max_tokens a request may ask for: the model's
  // max_position_embeddings (when the config has it), at most
  // engine::kMaxSequenceTokens.
  int64_t max_context() const;

  struct Counts {
    int64_t waiting = 0;
    int64_t prefilling = 0;
    int64_t decoding = 0;
    // The engine's free KV pages and state slots, as of the loop's last
    // iteration (the engine is read on the loop thread only).
    int64_t free_pages = 0;
    int64_t free_slots = 0;
    // The largest decode batch stepped since the loop started.
    int64_t batch_peak = 0;
    // Prefill calls still running for requests that already ended (their
    // cancellation sent); they count against max_batch until they return.
    int64_t orphaned_calls = 0;
    // Reads of prompts' cached pages (options.read_history_pages): prompts
    // whose pages were read, the pages read and kept (prefill sent only those
    // after them; it may send some read pages again: transfer.h "Held
    // pages"), and reads that failed (prefill sent every page).
    int64_t history_reads = 0;
    int64_t history_pages = 0;
    int64_t history_failures = 0;
    // Requests prefilled here (options.local_prefill_max_tokens), and local
    // prefills that failed (the prefill pool took the request).
    int64_t local_prefills = 0;
    int64_t local_prefill_failures = 0;
    int64_t local_prefill_tokens = 0;  // the tokens they computed (the uncached ones)
    // Where the local prefills' time went, summed: the cache probe, lookup,
    // fetch and restore; the engine's prefill and the first token's sampling.
    absl::Duration local_prefill_resume;
    absl::Duration local_prefill_compute;
    // Requests prefilled here after their prefill call failed
    // (options.fallback_prefill_max_tokens), by why: UNAVAILABLE (no prefill
    // worker answered) or any other failure of the call or its transfer; and
    // fallbacks that failed too (the request ended with kError).
    int64_t fallback_prefills_unavailable = 0;
    int64_t fallback_prefills_failed = 0;
    int64_t fallback_prefill_failures = 0;
  };
  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);
  // True when no request is live, no turn end is being published, no prefill
  // call of an ended request is running and every reservation of an ended
  // request has been freed.
  bool Idle() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Request;  // a live request, owned by the loop
  struct Prefilled {
    std::string key;  // the request's ScopedRequestId
    absl::StatusOr<prefill::PrefillOutcome> outcome;
    int64_t held_pages = 0;  // the prompt's pages read from the cache into the reservation
  };

  DecodeLoop(engine::Model& model, const common::Hash128& fingerprint, prefill::PrefillClient& prefill,
             transport::StateReceiver& receiver, const DecodeLoopOptions& options);

  void Run();
  // The loop's steps; each runs on the loop thread without mu_.
  void Admit();
  // For the request at the head of the queue: prefills it in this engine
  // when the local prefill applies, and moves it to the batch; false when it
  // is left to the prefill pool.
  bool PrefillHere(Request& r);
  void Import(Prefilled prefilled);
  // After `r`'s prefill call (or its transfer) failed with `failure`: frees
  // its reservation and prefills it in this engine (options.fallback_prefill_max_tokens),
  // moving it to the batch; otherwise ends it with kError.
  void FallBack(Request& r, const absl::Status& failure);
  void Step();
  // Emits `token` for `r` and ends it when a stop condition holds.
  void Emit(Request& r, const engine::SampledToken& token);
  // Ends the live request known by `key` (its ScopedRequestId).
  void Finish(const std::string& key, FinishReason reason, absl::Status error, TokenId stop_token = -1);
  void JoinFinishedCalls() ABSL_LOCKS_EXCLUDED(mu_);
  // Requests holding a place in the batch: prefilling, decoding, and ended
  // ones whose prefill call has not returned yet.
  int64_t Running() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return prefilling_ + decoding_ + static_cast<int64_t>(orphaned_calls_.size());
  }

  engine::Model& model_;
  prefill::PrefillClient& prefill_;
  const cachestore::ModelNamespace namespace_;
  transport::StateReceiver& receiver_;
  const DecodeLoopOptions options_;

  // Live requests by their ScopedRequestId (as are waiting_, aborts_ and
  // batch_), owned here; touched by the loop thread only, except that Submit
  // and Abort look ids up under mu_.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Request>> live_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<Prefilled> prefilled_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> aborts_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int64_t prefilling_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t decoding_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t free_pages_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t free_slots_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t batch_peak_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_transfer_ ABSL_GUARDED_BY(mu_) = 1;
  // Prefill call threads, and those that have returned (joined by the loop).
  absl::flat_hash_map<uint64_t, std::thread> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_calls_ ABSL_GUARDED_BY(mu_);
  // Transfer ids of the calls still running, and of those among them whose
  // request has ended (orphans: they still hold a prefill worker's slot).
  absl::flat_hash_set<uint64_t> calls_running_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> orphaned_calls_ ABSL_GUARDED_BY(mu_);
  // Reservations of ended requests whose call may still write their pages
  // (HistoryReader::Read), by transfer id: aborted once the call is joined.
  absl::flat_hash_map<uint64_t, engine::SequenceId> deferred_aborts_ ABSL_GUARDED_BY(mu_);
  int64_t history_pages_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fallback_unavailable_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fallback_failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fallback_failures_ ABSL_GUARDED_BY(mu_) = 0;

  common::LogRateLimiter log_limiter_;
  // With a cache: its backoff (never null then), the history reads (with
  // options.read_history_pages) and the local prefill (with a
  // KeepingPrefill and options.local_prefill_max_tokens). The turn ends
  // (never null) publish with a cache and options.publish.
  std::shared_ptr<cachestore::CacheBackoff> cache_backoff_;
  std::unique_ptr<HistoryReader> history_reader_;
  std::unique_ptr<LocalPrefill> local_prefill_;
  // With options.fallback_prefill_max_tokens > 0: the prefill of a request
  // whose call failed (loop thread only), and the loop thread's memory of
  // whether the last prefill call failed (to log each change once).
  KeepingPrefill fallback_prefill_;
  bool pool_failing_ = false;
  std::unique_ptr<TurnEnd> turn_end_;

  // Loop-thread state: the running sequences in batch order.
  std::vector<std::string> batch_;
  std::thread loop_;
};

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_DECODE_LOOP_H_
