#ifndef HYBRIDSERVE_TRANSPORT_FRAME_H_
#define HYBRIDSERVE_TRANSPORT_FRAME_H_

// The data plane's frames: the TCP plane writes them on a socket, the channel
// planes (NCCL, CUDA IPC) send each as two messages, header then payload
// (their own sequence: transport/channel_protocol.h). Every integer little-endian; every frame a
// 48-byte header and a payload:
//
//   offset size  field
//   0      4     magic "HSXF"
//   4      2     u16 version (2; kFrameVersion)
//   6      2     u16 type (FrameType)
//   8      8     u64 transfer id
//   16     8     u64 index: the page index of a kPage frame, else 0
//   24     8     u64 payload bytes
//   32     8     u64 XXH3-64 (seed 0) of the payload
//   40     8     u64 XXH3-64 (seed 0) of header bytes [0, 40)
//   48     ...   payload
//
//   (index also carries, on the channel planes, the placement of a verdict
//   kAck: 1 when pages travel in place, 0 when staged; channel_protocol.h)
//
// A TCP transfer, on one connection from the sender: kBegin (payload
// BeginPayload, 64 bytes, with the ticket's secret; its header's index is
// the first page the sender sends, the ticket's held_pages, 0 unless the
// receiver holds pages: transfer.h "Held pages"), kPage for pages
// index, index + 1, ... in order (page_bytes each), kState (the encoded state), kEnd
// (EndPayload, 8 bytes); then the receiver answers one kAck (payload: u32
// absl::StatusCode, then a message of at most kMaxAckMessage bytes) and
// closes. A receiver that refuses a transfer answers kAck with the error at
// once and closes; but a connection whose first frame is not an intact kBegin
// presenting the secret of a ticket the receiver expects gets no answer at
// all: it is closed (tcp_transport.h).
//
// Versions. 2 added the secret to kBegin. Version 1 frames (a sender of an
// earlier release, which has no secret to present) are refused by name.
//
// The channel planes add (channel_protocol.h): a kBegin payload may
// continue with an in-place offer (RegionOffer, below), and kPageSums
// carries the checksums of the sampled pages of a transfer whose pages
// travelled in place. TCP never sends either and refuses them as unexpected frames.
//
// Decoding never trusts its input: the header checksum first, then magic,
// version and type; payload sizes are checked against what the transfer's
// ticket allows before any allocation; payload checksums before use.
//
// All functions are thread-safe (no shared state).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/hash.h"
#include "transport/transfer.h"
#include "transport/transfer_secret.h"

namespace hybridserve::transport {

inline constexpr size_t kFrameHeaderBytes = 48;
inline constexpr uint16_t kFrameVersion = 2;
inline constexpr size_t kBeginPayloadBytes = 64;
inline constexpr size_t kEndPayloadBytes = 8;
inline constexpr size_t kMaxAckMessage = 1024;
// The most regions an in-place offer may announce per page.
inline constexpr size_t kMaxPageRegions = 4096;

enum class FrameType : uint16_t {
  kBegin = 1,
  kPage = 2,
  kState = 3,
  kEnd = 4,
  kAck = 5,
  kPageSums = 6,  // NCCL in place: u64 XXH3-64 of each sampled page, in page order
};

struct FrameHeader {
  FrameType type = FrameType::kBegin;
  uint64_t transfer_id = 0;
  uint64_t index = 0;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
};

// kBegin's payload: the ticket's secret, and what the sender will send,
// checked against the ticket.
//   0 i64 n_tokens, 8 page format (Hash128 lo, hi), 24 i64 num_pages,
//   32 i64 page_bytes, 40 i64 state_bytes,
//   48 16 bytes: the ticket's secret (Ticket::secret, kTransferSecretBytes)
struct BeginPayload {
  int64_t n_tokens = 0;
  common::Hash128 page_format;
  int64_t num_pages = 0;
  int64_t page_bytes = 0;
  int64_t state_bytes = 0;
  std::string secret;  // kTransferSecretBytes; EncodeBegin zero-pads or cuts another length
};

// kEnd's payload: 0 i32 first token, 4 f32 its log-probability.
struct EndPayload {
  int32_t first_token = 0;
  float first_logprob = 0.0f;
};

// The in-place offer that may follow BeginPayload in a kBegin payload (NCCL):
//   0 u32 region count n (1 .. kMaxPageRegions), 4 u32 0,
//   8 n x i64 region bytes: how every page splits into the messages it
//   travels as, in page byte order (each >= 1, summing to page_bytes).
// RegionOfferBytes(n) = 8 + 8 n.
inline size_t RegionOfferBytes(size_t regions) { return 8 + 8 * regions; }
std::string EncodeRegionOffer(const std::vector<int64_t>& region_bytes);
// INVALID_ARGUMENT for a malformed offer (sizes, count, a region < 1 byte).
absl::StatusOr<std::vector<int64_t>> DecodeRegionOffer(absl::string_view bytes);

// The kBegin payload a sender of `source` for `ticket` sends: the ticket's
// tokens, page format and secret, the source's pages and state size (what
// CheckBeginAgainstTicket checks on the other side). Used by every sender
// (TCP and the channel planes).
BeginPayload BeginOf(const Ticket& ticket, const StateSource& source);

// OK when `begin` announces what `ticket` expects: the same tokens, page
// format, number and size of pages, and a state of 1 to max_state_bytes
// bytes; INVALID_ARGUMENT saying both sides otherwise.
absl::Status CheckBeginAgainstTicket(uint64_t transfer_id, const BeginPayload& begin, const Ticket& ticket);

// The 48 header bytes of a frame carrying `payload`.
std::string EncodeFrameHeader(FrameType type, uint64_t transfer_id, uint64_t index, absl::string_view payload);
// The same for a payload of `payload_bytes` whose XXH3-64 is `payload_checksum`
// (a payload sent from several places: the checksum of its parts in order).
std::string EncodeFrameHeader(FrameType type, uint64_t transfer_id, uint64_t index, uint64_t payload_bytes,
                              uint64_t payload_checksum);
// INVALID_ARGUMENT unless `bytes` (kFrameHeaderBytes) is an intact header of
// this version with a known type (another version is named: "frame version
// 1 (...)"); DATA_LOSS for a header checksum mismatch.
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view bytes);
// DATA_LOSS unless `payload` has the header's size and checksum.
absl::Status CheckPayload(const FrameHeader& header, absl::string_view payload);

std::string EncodeBegin(const BeginPayload& begin);
absl::StatusOr<BeginPayload> DecodeBegin(absl::string_view payload);
std::string EncodeEnd(const EndPayload& end);
absl::StatusOr<EndPayload> DecodeEnd(absl::string_view payload);
// kAck payload for `status` (message truncated to kMaxAckMessage).
std::string EncodeAck(const absl::Status& status);
// Sets `*carried` to the status an ack carries; INVALID_ARGUMENT for a
// malformed ack (and `*carried` unchanged).
absl::Status DecodeAck(absl::string_view payload, absl::Status* carried);

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_FRAME_H_
