#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_SHM_WRITER_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_SHM_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cachestore/client/direct_writer.h"

namespace hybridserve::cachestore {

struct ShmWriterOptions {
  std::string socket_path;  // the cachestore's --shm_socket
  // Connect, and each request and answer.
  absl::Duration timeout = absl::Seconds(10);
  // Entry bytes one request carries (an entry larger than this goes alone).
  int64_t request_bytes = int64_t{16} << 20;
  // Memfds kept between calls, so that a put writes into pages it already
  // has rather than into new ones the kernel must allocate and zero (for a
  // 64 MiB entry, twice the time of the rest of the put): at most
  // kept_memfds of them, holding at most kept_bytes together (one that would
  // pass it is closed after its call). They are this process's memory.
  int kept_memfds = 2;
  int64_t kept_bytes = int64_t{256} << 20;
};

// Puts entries through the cachestore's shm socket when the two share a host
// (shm_protocol.h, "HSP1"): each request's bytes are copied into a mapped
// memfd of this process (hashed a piece at a time while hot) and a read-only
// descriptor of it sent (the cachestore can read the buffer, not write into
// it); the cachestore copies each entry once from it into the entry's place
// and verifies it there. One connection per call.
// Thread-safe.
class ShmWriter final : public DirectWriter {
 public:
  explicit ShmWriter(ShmWriterOptions options);
  ~ShmWriter() override;
  ShmWriter(const ShmWriter&) = delete;
  ShmWriter& operator=(const ShmWriter&) = delete;

  const char* name() const override { return "shm"; }
  absl::Status Put(const ClientNamespace& ns, absl::Span<const PutManyEntry> entries,
                   std::vector<absl::StatusOr<PutResult>>* results) override;

 private:
  // A memfd of this process, mapped, that a request's bytes are written into.
  class PutBuffer;
  // One request of `entries` on the connection `sock`.
  absl::Status PutRequest(int sock, const ClientNamespace& ns, absl::Span<const PutManyEntry> entries,
                          std::vector<absl::StatusOr<PutResult>>* results);
  // A buffer of at least `size` bytes to write a request into (a kept one,
  // grown if need be, or a new one), and back after its request's answer.
  absl::StatusOr<std::unique_ptr<PutBuffer>> TakeBuffer(size_t size) ABSL_LOCKS_EXCLUDED(mu_);
  void KeepBuffer(std::unique_ptr<PutBuffer> buffer) ABSL_LOCKS_EXCLUDED(mu_);

  const ShmWriterOptions options_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<PutBuffer>> kept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_SHM_WRITER_H_
