#include "transport/transfer_secret.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hybridserve::transport {

absl::StatusOr<std::string> RandomSecret(size_t bytes) {
  if (bytes > 256) return absl::InvalidArgumentError(absl::StrCat("a secret of ", bytes, " bytes (at most 256)"));
  std::string out(bytes, '\0');
  size_t filled = 0;
  while (filled < bytes) {
    // Up to 256 bytes come whole once the pool is seeded; a signal before
    // then interrupts (EINTR) and is retried.
    const ssize_t n = getrandom(out.data() + filled, bytes - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    filled += static_cast<size_t>(n);
  }
  return out;
}

absl::StatusOr<std::string> NewTransferSecret() { return RandomSecret(kTransferSecretBytes); }

bool SecretsEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  // OR of XORs over every byte; volatile keeps the compiler from turning the
  // loop into a compare that stops at the first difference.
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = diff | static_cast<unsigned char>(static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

}  // namespace hybridserve::transport
