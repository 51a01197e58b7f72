#include "transport/channel_protocol.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hybridserve::transport {

absl::Status SendFrame(Communicator& comm, FrameType type, uint64_t transfer_id, uint64_t index,
                       absl::string_view payload, absl::Time deadline) {
  const std::string header = EncodeFrameHeader(type, transfer_id, index, payload);
  RETURN_IF_ERROR(comm.Send(header.data(), header.size(), deadline));
  if (payload.empty()) return absl::OkStatus();
  return comm.Send(payload.data(), payload.size(), deadline);
}

namespace {

absl::StatusOr<FrameHeader> RecvHeader(Communicator& comm, absl::Time deadline) {
  char raw[kFrameHeaderBytes];
  RETURN_IF_ERROR(comm.Recv(raw, sizeof(raw), deadline));
  return DecodeFrameHeader(absl::string_view(raw, sizeof(raw)));
}

// The payload of an ack whose header `h` arrived. Errors are the channel's.
absl::Status RecvAckPayload(Communicator& comm, const FrameHeader& h, absl::Time deadline, absl::Status* carried) {
  if (h.payload_bytes < 4 || h.payload_bytes > 4 + kMaxAckMessage) {
    return absl::InvalidArgumentError(absl::StrCat("ack of ", h.payload_bytes, " payload bytes"));
  }
  std::string payload(static_cast<size_t>(h.payload_bytes), '\0');
  RETURN_IF_ERROR(comm.Recv(payload.data(), payload.size(), deadline));
  RETURN_IF_ERROR(CheckPayload(h, payload));
  return DecodeAck(payload, carried);
}

}  // namespace

absl::Status RecvAck(Communicator& comm, uint64_t transfer_id, absl::Time deadline, absl::Status* carried,
                     uint64_t* index) {
  ASSIGN_OR_RETURN(const FrameHeader h, RecvHeader(comm, deadline));
  if (index != nullptr) *index = h.index;
  if (h.type != FrameType::kAck || h.transfer_id != transfer_id) {
    return absl::InvalidArgumentError(absl::StrCat("expected the ack of transfer ", transfer_id, ", got frame type ",
                                                   static_cast<int>(h.type), " of transfer ", h.transfer_id));
  }
  return RecvAckPayload(comm, h, deadline, carried);
}

absl::StatusOr<bool> RecvFrame(Communicator& comm, absl::Time deadline, FrameType type, uint64_t transfer_id,
                               uint64_t index, uint64_t payload_bytes, std::string* payload, absl::Status* outcome) {
  ASSIGN_OR_RETURN(const FrameHeader h, RecvHeader(comm, deadline));
  if (h.type == FrameType::kAck && h.transfer_id == transfer_id) {
    absl::Status carried;
    RETURN_IF_ERROR(RecvAckPayload(comm, h, deadline, &carried));
    if (outcome->ok()) {
      *outcome = absl::UnavailableError(absl::StrCat("the sender gave up transfer ", transfer_id, ": ",
                                                     carried.ok() ? "no reason given" : carried.ToString()));
    }
    return false;
  }
  if (h.type != type || h.transfer_id != transfer_id || h.index != index || h.payload_bytes != payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer_id, ": expected frame type ",
                                                   static_cast<int>(type), " index ", index, " of ", payload_bytes,
                                                   " bytes, got type ", static_cast<int>(h.type), " index ", h.index,
                                                   " of ", h.payload_bytes, " bytes of transfer ", h.transfer_id));
  }
  payload->assign(static_cast<size_t>(payload_bytes), '\0');
  if (payload_bytes > 0) RETURN_IF_ERROR(comm.Recv(payload->data(), payload->size(), deadline));
  if (absl::Status s = CheckPayload(h, *payload); !s.ok() && outcome->ok()) {
    *outcome = absl::DataLossError(absl::StrCat("transfer ", transfer_id, ": ", s.message()));
  }
  return true;
}

std::string RegionSplitText(const std::vector<int64_t>& split) {
  std::string s;
  for (size_t r = 0; r < split.size(); ++r) absl::StrAppend(&s, r == 0 ? "" : ",", split[r]);
  return s;
}

}  // namespace hybridserve::transport
