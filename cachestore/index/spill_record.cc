#include "cachestore/index/spill_record.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace hybridserve::cachestore {
namespace {

constexpr size_t kFixedBytes = 100;

void PutU32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutU64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}
uint64_t GetU64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}
void PutF64(double v, char* out) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  PutU64(bits, out);
}
double GetF64(const char* in) {
  const uint64_t bits = GetU64(in);
  double v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

}  // namespace

std::string EncodeSpillRecord(const SpillRecord& r) {
  std::string out(kFixedBytes + r.tenant.size() + r.tail.size() * sizeof(TokenId), '\0');
  char* p = out.data();
  PutU32(kSpillRecordVersion, p);
  p[4] = r.entry_class == EntryClass::kState ? 1 : 0;
  p[5] = r.entry_class == EntryClass::kState && r.state_kind == StateKind::kExactPrefix ? 1 : 0;
  p[6] = r.parent.has_value() ? 1 : 0;
  p[7] = r.model_cost.has_value() ? 1 : 0;
  PutU64(r.ns.lo, p + 8);
  PutU64(r.ns.hi, p + 16);
  if (r.parent.has_value()) {
    PutU64(r.parent->lo, p + 24);
    PutU64(r.parent->hi, p + 32);
  }
  PutU32(static_cast<uint32_t>(r.page_size), p + 40);
  PutU32(static_cast<uint32_t>(r.tail.size()), p + 44);
  PutU64(static_cast<uint64_t>(r.position), p + 48);
  PutU64(r.checksum, p + 56);
  PutU64(static_cast<uint64_t>(r.size_bytes), p + 64);
  PutU64(static_cast<uint64_t>(absl::ToInt64Nanoseconds(r.ttl)), p + 72);
  if (r.model_cost.has_value()) {
    PutF64(r.model_cost->flops_per_token, p + 80);
    PutF64(r.model_cost->flops_per_token_context, p + 88);
  }
  PutU32(static_cast<uint32_t>(r.tenant.size()), p + 96);
  std::memcpy(p + kFixedBytes, r.tenant.data(), r.tenant.size());
  char* tail = p + kFixedBytes + r.tenant.size();
  for (size_t i = 0; i < r.tail.size(); ++i) PutU32(static_cast<uint32_t>(r.tail[i]), tail + 4 * i);
  return out;
}

absl::StatusOr<SpillRecord> DecodeSpillRecord(const Hash128& key, absl::string_view bytes) {
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("spill record of ", key.ToHex(), ": ", what));
  };
  if (bytes.size() < kFixedBytes) return bad(absl::StrCat(bytes.size(), " bytes, shorter than ", kFixedBytes));
  const char* p = bytes.data();
  if (const uint32_t version = GetU32(p); version != kSpillRecordVersion) {
    return bad(absl::StrCat("version ", version, ", this build reads ", kSpillRecordVersion));
  }
  if (p[4] > 1 || p[5] > 1 || p[6] > 1 || p[7] > 1) return bad("a flag byte is neither 0 nor 1");
  SpillRecord r;
  r.key = key;
  r.entry_class = p[4] == 1 ? EntryClass::kState : EntryClass::kPage;
  // Pages keep the struct's default kind.
  if (r.entry_class == EntryClass::kState && p[5] == 0) r.state_kind = StateKind::kGridCheckpoint;
  r.ns = Hash128{GetU64(p + 8), GetU64(p + 16)};
  if (p[6] == 1) r.parent = Hash128{GetU64(p + 24), GetU64(p + 32)};
  r.page_size = static_cast<int32_t>(GetU32(p + 40));
  const uint64_t tail_tokens = GetU32(p + 44);
  r.position = static_cast<int64_t>(GetU64(p + 48));
  r.checksum = GetU64(p + 56);
  r.size_bytes = static_cast<int64_t>(GetU64(p + 64));
  r.ttl = absl::Nanoseconds(static_cast<int64_t>(GetU64(p + 72)));
  if (p[7] == 1) r.model_cost = PrefillCost{GetF64(p + 80), GetF64(p + 88)};
  const uint64_t tenant_bytes = GetU32(p + 96);
  if (bytes.size() != kFixedBytes + tenant_bytes + tail_tokens * sizeof(TokenId)) {
    return bad(absl::StrCat(bytes.size(), " bytes, its lengths say ",
                            kFixedBytes + tenant_bytes + tail_tokens * sizeof(TokenId)));
  }
  if (r.entry_class == EntryClass::kPage && tail_tokens != 0) return bad("a page with tail tokens");
  if (r.page_size <= 0 || r.size_bytes < 0 || r.position <= 0 || r.ttl < absl::ZeroDuration()) {
    return bad("page size, size, position or ttl out of range");
  }
  r.tenant.assign(p + kFixedBytes, tenant_bytes);
  const char* tail = p + kFixedBytes + tenant_bytes;
  r.tail.resize(tail_tokens);
  for (size_t i = 0; i < tail_tokens; ++i) r.tail[i] = static_cast<TokenId>(GetU32(tail + 4 * i));
  return r;
}

}  // namespace hybridserve::cachestore
