#ifndef HYBRIDSERVE_CACHESTORE_WIRE_PUT_ANSWERS_H_
#define HYBRIDSERVE_CACHESTORE_WIRE_PUT_ANSWERS_H_

// The answer to a put by a direct path, the same on the shm socket ("HSP1",
// shm_protocol.h) and the bulk port ("HBP1", bulk_protocol.h) but for its
// magic. All integers little-endian.
//
//   u32 magic
//   u32 code                 OK, or why no entry was taken
//   u32 answer_count         one per entry when OK, else 0
//   u32 message_bytes        the status message's length
//   message_bytes bytes
//   answer_count x (u32 bytes, a serialized v1::PutManyResponse of at most
//                  kMaxPutAnswerBytes)

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hybridserve::cachestore {

inline constexpr uint32_t kMaxPutAnswerBytes = 64u << 10;

struct PutAnswers {
  absl::Status status;               // OK: one answer per entry
  std::vector<std::string> answers;  // serialized v1::PutManyResponse
};

// The answer's bytes (the message cut to `max_message_bytes`; no answers
// unless the status is OK).
std::string EncodePutAnswers(uint32_t magic, const PutAnswers& answers, size_t max_message_bytes);

// Reads an answer through `read` (which fills exactly the bytes it is asked
// for, or fails). INVALID_ARGUMENT naming `what` for a malformed one (another
// magic, an unknown code, answers with a refusal or more than `max_answers`,
// a message or an answer over its limit); `read`'s errors otherwise.
absl::StatusOr<PutAnswers> DecodePutAnswers(uint32_t magic, size_t max_answers, size_t max_message_bytes,
                                            absl::FunctionRef<absl::Status(char*, size_t)> read,
                                            absl::string_view what);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_WIRE_PUT_ANSWERS_H_
