#include "transport/frame.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace hybridserve::transport {
namespace {

static_assert(kBeginPayloadBytes == 48 + kTransferSecretBytes, "BeginPayload's layout (frame.h)");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "frames are little-endian; fields are copied as is");

constexpr char kMagic[4] = {'H', 'S', 'X', 'F'};
constexpr size_t kHeaderChecked = 40;

template <typename T>
void Put(std::string& s, size_t offset, T v) {
  std::memcpy(s.data() + offset, &v, sizeof(T));
}

template <typename T>
T Get(absl::string_view s, size_t offset) {
  T v;
  std::memcpy(&v, s.data() + offset, sizeof(T));
  return v;
}

}  // namespace

std::string EncodeFrameHeader(FrameType type, uint64_t transfer_id, uint64_t index, absl::string_view payload) {
  return EncodeFrameHeader(type, transfer_id, index, payload.size(),
                           common::Checksum64(payload.data(), payload.size()));
}

std::string EncodeFrameHeader(FrameType type, uint64_t transfer_id, uint64_t index, uint64_t payload_bytes,
                              uint64_t payload_checksum) {
  std::string h(kFrameHeaderBytes, '\0');
  std::memcpy(h.data(), kMagic, sizeof(kMagic));
  Put<uint16_t>(h, 4, kFrameVersion);
  Put<uint16_t>(h, 6, static_cast<uint16_t>(type));
  Put<uint64_t>(h, 8, transfer_id);
  Put<uint64_t>(h, 16, index);
  Put<uint64_t>(h, 24, payload_bytes);
  Put<uint64_t>(h, 32, payload_checksum);
  Put<uint64_t>(h, 40, common::Checksum64(h.data(), kHeaderChecked));
  return h;
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view bytes) {
  if (bytes.size() != kFrameHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame header of ", bytes.size(), " bytes"));
  }
  if (common::Checksum64(bytes.data(), kHeaderChecked) != Get<uint64_t>(bytes, 40)) {
    return absl::DataLossError("frame header checksum mismatch");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("not a hybridserve transfer frame (bad magic)");
  }
  const uint16_t version = Get<uint16_t>(bytes, 4);
  if (version == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame version 1 (a sender without ticket secrets, from an earlier release) is refused: this "
                     "build speaks frame version ",
                     kFrameVersion, "; run decode and prefill workers of the same release"));
  }
  if (version != kFrameVersion) {
    return absl::InvalidArgumentError(absl::StrCat("frame version ", version, ", this build speaks ", kFrameVersion));
  }
  const uint16_t type = Get<uint16_t>(bytes, 6);
  if (type < static_cast<uint16_t>(FrameType::kBegin) || type > static_cast<uint16_t>(FrameType::kPageSums)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown frame type ", type));
  }
  FrameHeader h;
  h.type = static_cast<FrameType>(type);
  h.transfer_id = Get<uint64_t>(bytes, 8);
  h.index = Get<uint64_t>(bytes, 16);
  h.payload_bytes = Get<uint64_t>(bytes, 24);
  h.payload_checksum = Get<uint64_t>(bytes, 32);
  return h;
}

absl::Status CheckPayload(const FrameHeader& header, absl::string_view payload) {
  if (payload.size() != header.payload_bytes) {
    return absl::DataLossError(
        absl::StrCat("frame payload of ", payload.size(), " bytes, the header says ", header.payload_bytes));
  }
  if (common::Checksum64(payload.data(), payload.size()) != header.payload_checksum) {
    return absl::DataLossError(absl::StrCat("frame payload checksum mismatch (type ", static_cast<int>(header.type),
                                            ", index ", header.index, ")"));
  }
  return absl::OkStatus();
}

std::string EncodeBegin(const BeginPayload& b) {
  std::string s(kBeginPayloadBytes, '\0');
  Put<int64_t>(s, 0, b.n_tokens);
  Put<uint64_t>(s, 8, b.page_format.lo);
  Put<uint64_t>(s, 16, b.page_format.hi);
  Put<int64_t>(s, 24, b.num_pages);
  Put<int64_t>(s, 32, b.page_bytes);
  Put<int64_t>(s, 40, b.state_bytes);
  std::memcpy(s.data() + 48, b.secret.data(), std::min(b.secret.size(), kTransferSecretBytes));
  return s;
}

absl::StatusOr<BeginPayload> DecodeBegin(absl::string_view p) {
  if (p.size() != kBeginPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("begin payload of ", p.size(), " bytes, expected ", kBeginPayloadBytes));
  }
  BeginPayload b;
  b.n_tokens = Get<int64_t>(p, 0);
  b.page_format.lo = Get<uint64_t>(p, 8);
  b.page_format.hi = Get<uint64_t>(p, 16);
  b.num_pages = Get<int64_t>(p, 24);
  b.page_bytes = Get<int64_t>(p, 32);
  b.state_bytes = Get<int64_t>(p, 40);
  b.secret = std::string(p.substr(48, kTransferSecretBytes));
  return b;
}

BeginPayload BeginOf(const Ticket& ticket, const StateSource& source) {
  BeginPayload begin;
  begin.n_tokens = ticket.n_tokens;
  begin.page_format = ticket.page_format;
  begin.num_pages = source.num_pages();
  begin.page_bytes = source.page_bytes();
  begin.state_bytes = static_cast<int64_t>(source.state().size());
  begin.secret = ticket.secret;
  return begin;
}

absl::Status CheckBeginAgainstTicket(uint64_t transfer_id, const BeginPayload& begin, const Ticket& ticket) {
  if (begin.n_tokens != ticket.n_tokens || begin.page_format != ticket.page_format ||
      begin.num_pages != ticket.num_pages || begin.page_bytes != ticket.page_bytes || begin.state_bytes < 1 ||
      begin.state_bytes > ticket.max_state_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", transfer_id, " announces ", begin.n_tokens, " tokens, ", begin.num_pages, " pages of ",
        begin.page_bytes, " bytes and a state of ", begin.state_bytes, " bytes; the ticket says ", ticket.n_tokens,
        " tokens, ", ticket.num_pages, " pages of ", ticket.page_bytes, " bytes, a state of at most ",
        ticket.max_state_bytes, (begin.page_format != ticket.page_format ? ", and another page format" : "")));
  }
  return absl::OkStatus();
}

std::string EncodeRegionOffer(const std::vector<int64_t>& region_bytes) {
  std::string s(RegionOfferBytes(region_bytes.size()), '\0');
  Put<uint32_t>(s, 0, static_cast<uint32_t>(region_bytes.size()));
  for (size_t r = 0; r < region_bytes.size(); ++r) Put<int64_t>(s, 8 + 8 * r, region_bytes[r]);
  return s;
}

absl::StatusOr<std::vector<int64_t>> DecodeRegionOffer(absl::string_view p) {
  if (p.size() < RegionOfferBytes(1)) {
    return absl::InvalidArgumentError(absl::StrCat("in-place offer of ", p.size(), " bytes"));
  }
  const uint32_t n = Get<uint32_t>(p, 0);
  if (n < 1 || n > kMaxPageRegions || p.size() != RegionOfferBytes(n) || Get<uint32_t>(p, 4) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("in-place offer of ", p.size(), " bytes announces ", n, " regions"));
  }
  std::vector<int64_t> regions(n);
  for (uint32_t r = 0; r < n; ++r) {
    regions[r] = Get<int64_t>(p, 8 + 8 * size_t{r});
    if (regions[r] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("in-place offer: region ", r, " of ", regions[r], " bytes"));
    }
  }
  return regions;
}

std::string EncodeEnd(const EndPayload& e) {
  std::string s(kEndPayloadBytes, '\0');
  Put<int32_t>(s, 0, e.first_token);
  Put<float>(s, 4, e.first_logprob);
  return s;
}

absl::StatusOr<EndPayload> DecodeEnd(absl::string_view p) {
  if (p.size() != kEndPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat("end payload of ", p.size(), " bytes, expected 8"));
  }
  EndPayload e;
  e.first_token = Get<int32_t>(p, 0);
  e.first_logprob = Get<float>(p, 4);
  return e;
}

std::string EncodeAck(const absl::Status& status) {
  const absl::string_view message = status.message().substr(0, kMaxAckMessage);
  std::string s(4, '\0');
  Put<uint32_t>(s, 0, static_cast<uint32_t>(status.code()));
  s.append(message.data(), message.size());
  return s;
}

absl::Status DecodeAck(absl::string_view p, absl::Status* carried) {
  if (p.size() < 4 || p.size() > 4 + kMaxAckMessage) {
    return absl::InvalidArgumentError(absl::StrCat("ack payload of ", p.size(), " bytes"));
  }
  const uint32_t code = Get<uint32_t>(p, 0);
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InvalidArgumentError(absl::StrCat("ack with unknown status code ", code));
  }
  *carried = absl::Status(static_cast<absl::StatusCode>(code), p.substr(4));
  return absl::OkStatus();
}

}  // namespace hybridserve::transport
