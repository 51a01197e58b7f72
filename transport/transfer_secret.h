#ifndef HYBRIDSERVE_TRANSPORT_TRANSFER_SECRET_H_
#define HYBRIDSERVE_TRANSPORT_TRANSFER_SECRET_H_

// The data plane's proofs (docs/ARCHITECTURE.md section 5, "Who may send"):
// random secrets a receiver puts on what it hands out (a ticket's
// Ticket::secret, the token of a CUDA IPC channel's id) and compares with
// what a sender presents.
//
// Randomness comes from getrandom(2) (flags 0: the kernel's CSPRNG, the pool
// behind /dev/urandom, which blocks only until it has been seeded once at
// boot). Not std::random_device: the standard promises no cryptographic
// quality (libstdc++ picks rdrand, rdseed, getrandom or /dev/urandom by
// build and token, and other libraries have been deterministic), and
// getrandom needs no file descriptor, so it cannot fail for want of one.
//
// Thread-safe (no shared state).

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hybridserve::transport {

// The length of Ticket::secret: 128 bits, beyond guessing over a network.
inline constexpr size_t kTransferSecretBytes = 16;

// `bytes` (at most 256) random bytes from getrandom(2). INTERNAL when the
// kernel cannot give them (no getrandom: Linux before 3.17).
absl::StatusOr<std::string> RandomSecret(size_t bytes);

// A new Ticket::secret: RandomSecret(kTransferSecretBytes).
absl::StatusOr<std::string> NewTransferSecret();

// Whether `a` and `b` are equal, in a time that depends on their lengths only
// (lengths are not secret here: every secret of a kind has the same): every
// byte is compared, with no early exit, so a sender cannot learn a secret a
// byte at a time from how long a refusal takes.
bool SecretsEqual(absl::string_view a, absl::string_view b);

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_TRANSFER_SECRET_H_
