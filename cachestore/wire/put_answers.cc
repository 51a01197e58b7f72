#include "cachestore/wire/put_answers.h"

#include "absl/strings/str_cat.h"
#include "cachestore/wire/wire_ints.h"

namespace hybridserve::cachestore {

using wire::GetU32;
using wire::PutU32;

std::string EncodePutAnswers(uint32_t magic, const PutAnswers& answers, size_t max_message_bytes) {
  const std::string message(answers.status.message().substr(0, max_message_bytes));
  const bool ok = answers.status.ok();
  std::string out;
  PutU32(&out, magic);
  PutU32(&out, static_cast<uint32_t>(answers.status.code()));
  PutU32(&out, ok ? static_cast<uint32_t>(answers.answers.size()) : 0);
  PutU32(&out, static_cast<uint32_t>(message.size()));
  out += message;
  if (ok) {
    for (const std::string& a : answers.answers) {
      PutU32(&out, static_cast<uint32_t>(a.size()));
      out += a;
    }
  }
  return out;
}

absl::StatusOr<PutAnswers> DecodePutAnswers(uint32_t magic, size_t max_answers, size_t max_message_bytes,
                                            absl::FunctionRef<absl::Status(char*, size_t)> read,
                                            absl::string_view what) {
  char header[16];
  if (absl::Status s = read(header, sizeof(header)); !s.ok()) return s;
  const uint32_t code = GetU32(header + 4);
  const uint32_t count = GetU32(header + 8);
  const uint32_t message_bytes = GetU32(header + 12);
  if (GetU32(header) != magic || code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated) ||
      count > max_answers || message_bytes > max_message_bytes || (code != 0 && count != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": malformed header"));
  }
  std::string message(message_bytes, '\0');
  if (absl::Status s = read(message.data(), message.size()); !s.ok()) return s;
  PutAnswers answers;
  answers.status = absl::Status(static_cast<absl::StatusCode>(code), message);
  answers.answers.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    char length[4];
    if (absl::Status s = read(length, sizeof(length)); !s.ok()) return s;
    const uint32_t bytes = GetU32(length);
    if (bytes > kMaxPutAnswerBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": answer ", i, " of ", bytes, " bytes > ", kMaxPutAnswerBytes));
    }
    answers.answers[i].resize(bytes);
    if (absl::Status s = read(answers.answers[i].data(), bytes); !s.ok()) return s;
  }
  return answers;
}

}  // namespace hybridserve::cachestore
