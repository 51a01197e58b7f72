#include "transport/tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/hash.h"
#include "common/log_rate_limiter.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "transport/frame.h"

namespace hybridserve::transport {
namespace {

// Reads one frame header and its payload of at most `max_payload` bytes.
absl::Status ReadFrame(common::Socket& socket, absl::Time deadline, uint64_t max_payload, FrameHeader* header,
                       std::string* payload) {
  char raw[kFrameHeaderBytes];
  RETURN_IF_ERROR(socket.ReadFull(raw, sizeof(raw), deadline));
  ASSIGN_OR_RETURN(*header, DecodeFrameHeader(absl::string_view(raw, sizeof(raw))));
  if (header->payload_bytes > max_payload) {
    return absl::InvalidArgumentError(absl::StrCat("frame of type ", static_cast<int>(header->type), " announces ",
                                                   header->payload_bytes, " payload bytes, at most ", max_payload,
                                                   " allowed here"));
  }
  payload->resize(header->payload_bytes);
  RETURN_IF_ERROR(socket.ReadFull(payload->data(), payload->size(), deadline));
  return CheckPayload(*header, *payload);
}

// Reads one frame whose payload must be exactly `out.size()` bytes straight
// into `out` (a page of the transfer's block), then checks its checksum.
absl::Status ReadFrameInto(common::Socket& socket, absl::Time deadline, absl::Span<char> out, FrameHeader* header) {
  char raw[kFrameHeaderBytes];
  RETURN_IF_ERROR(socket.ReadFull(raw, sizeof(raw), deadline));
  ASSIGN_OR_RETURN(*header, DecodeFrameHeader(absl::string_view(raw, sizeof(raw))));
  if (header->payload_bytes != out.size()) {
    return absl::InvalidArgumentError(absl::StrCat("frame of type ", static_cast<int>(header->type), " index ",
                                                   header->index, " announces ", header->payload_bytes,
                                                   " payload bytes, ", out.size(), " expected"));
  }
  RETURN_IF_ERROR(socket.ReadFull(out.data(), out.size(), deadline));
  return CheckPayload(*header, absl::string_view(out.data(), out.size()));
}

absl::Status WriteFrame(common::Socket& socket, FrameType type, uint64_t transfer_id, uint64_t index,
                        absl::string_view payload, absl::Time deadline) {
  const std::string header = EncodeFrameHeader(type, transfer_id, index, payload);
  return socket.WriteAll({header, payload}, deadline);
}

// A frame whose payload is `parts` back to back, written with its header in
// one gathered write: no staging copy of the payload.
absl::Status WriteFrameParts(common::Socket& socket, FrameType type, uint64_t transfer_id, uint64_t index,
                             absl::Span<const absl::string_view> parts, absl::Time deadline) {
  common::StreamingChecksum checksum;
  uint64_t bytes = 0;
  for (absl::string_view part : parts) {
    checksum.Update(part.data(), part.size());
    bytes += part.size();
  }
  const std::string header = EncodeFrameHeader(type, transfer_id, index, bytes, checksum.Digest());
  std::vector<absl::string_view> frame;
  frame.reserve(parts.size() + 1);
  frame.push_back(header);
  frame.insert(frame.end(), parts.begin(), parts.end());
  return socket.WriteAll(frame, deadline);
}

absl::Status ExpectFrame(const FrameHeader& h, FrameType type, uint64_t transfer_id, uint64_t index) {
  if (h.type != type || h.transfer_id != transfer_id || h.index != index) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer_id, ": expected frame type ", static_cast<int>(type), " index ", index,
                     ", got type ", static_cast<int>(h.type), " index ", h.index, " of transfer ", h.transfer_id));
  }
  return absl::OkStatus();
}

}  // namespace

// ---- Receiver ----

absl::StatusOr<std::unique_ptr<TcpStateReceiver>> TcpStateReceiver::Create(const TcpReceiverOptions& options) {
  if (options.idle_timeout <= absl::ZeroDuration() || options.max_connections < 1) {
    return absl::InvalidArgumentError("TCP receiver: idle_timeout and max_connections must be positive");
  }
  if (options.socket_buffer_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP receiver: socket_buffer_bytes must be >= 0, got ", options.socket_buffer_bytes));
  }
  if (options.max_idle_page_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP receiver: max_idle_page_bytes must be >= 0, got ", options.max_idle_page_bytes));
  }
  std::string host, port;
  RETURN_IF_ERROR(common::SplitHostPort(options.address, &host, &port));
  int bound = 0;
  ASSIGN_OR_RETURN(common::Socket listener, common::Listen(options.address, &bound));
  const std::string endpoint = absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", bound);
  std::unique_ptr<TcpStateReceiver> r(new TcpStateReceiver(options, endpoint));
  TcpStateReceiver* p = r.get();
  const int buffer = options.socket_buffer_bytes;
  r->connections_ = std::make_unique<common::ConnectionServer>(
      std::move(listener), options.max_connections, [p](common::Socket& s) { p->Serve(&s); },
      [p] { p->registry_.CountRefused(); },
      [buffer](int fd) {
        if (buffer > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
      });
  return r;
}

TcpStateReceiver::TcpStateReceiver(const TcpReceiverOptions& options, std::string endpoint)
    : options_(options),
      registry_(options.limits),
      recycler_(PageBlockRecycler::Create(options.max_idle_page_bytes)),
      endpoint_(std::move(endpoint)) {}

TcpStateReceiver::~TcpStateReceiver() {
  stop_ = true;
  connections_.reset();
}

int64_t TcpStateReceiver::connections() const { return connections_->connections(); }

void TcpStateReceiver::Serve(common::Socket* socket) {
  FrameHeader h;
  BeginPayload begin;
  absl::StatusOr<Ticket> ticket = Admit(*socket, &h, &begin);
  if (absl::IsUnauthenticated(ticket.status())) {
    // Closed without a word: a peer that proved no ticket learns nothing
    // (not even whether the id is expected), and nothing expected was touched.
    int64_t held_back = 0;
    if (!stop_ && log_limiter_.Allow("unauthenticated", &held_back)) {
      LOG(WARNING) << "TCP data plane " << endpoint_ << ": dropped a connection from " << socket->PeerAddress()
                   << " that proved no ticket: " << ticket.status().message() << common::HeldBack(held_back);
    }
    return;
  }
  absl::Status status = ticket.status();
  if (status.ok()) {
    status = Receive(*socket, h.transfer_id, h.index, begin, *ticket);
  }  // else: a sender with the ticket's secret refused (already begun, finished): counted by Begin
  // Best effort: the peer may be gone.
  (void)WriteFrame(*socket, FrameType::kAck, h.transfer_id, 0, EncodeAck(status), absl::Now() + absl::Seconds(1));
}

absl::StatusOr<Ticket> TcpStateReceiver::Admit(common::Socket& socket, FrameHeader* h, BeginPayload* begin) {
  std::string payload;
  // At most kBeginPayloadBytes are read: a stranger cannot make the receiver allocate.
  absl::Status first = ReadFrame(socket, absl::Now() + options_.idle_timeout, kBeginPayloadBytes, h, &payload);
  if (first.ok() && h->type != FrameType::kBegin) {
    first = absl::InvalidArgumentError(
        absl::StrCat("a transfer starts with a begin frame, got type ", static_cast<int>(h->type)));
  }
  if (first.ok()) {
    absl::StatusOr<BeginPayload> decoded = DecodeBegin(payload);
    if (decoded.ok()) *begin = *std::move(decoded);
    first = decoded.status();
  }
  if (!first.ok()) {
    if (!stop_) registry_.CountUnauthenticated();  // (not a connection the destructor woke)
    return absl::UnauthenticatedError(absl::StrCat("no intact begin frame: ", first.message()));
  }
  return registry_.Begin(h->transfer_id, begin->secret);  // counts what it refuses
}

absl::Status TcpStateReceiver::Receive(common::Socket& socket, uint64_t transfer_id, uint64_t first_page,
                                       const BeginPayload& begin, const Ticket& ticket) {
  absl::Status status = ReceiveBegun(socket, transfer_id, first_page, begin, ticket);
  if (!status.ok()) registry_.Fail(transfer_id, status);  // no-op once Complete has run
  return status;
}

absl::Status TcpStateReceiver::ReceiveBegun(common::Socket& socket, uint64_t transfer_id, uint64_t first_page,
                                            const BeginPayload& begin, const Ticket& ticket) {
  auto deadline = [this, &ticket] { return std::min(absl::Now() + options_.idle_timeout, ticket.deadline); };
  RETURN_IF_ERROR(CheckBeginAgainstTicket(transfer_id, begin, ticket));
  if (first_page > static_cast<uint64_t>(begin.num_pages)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer_id, " starts at page ", first_page, " of its ", begin.num_pages));
  }
  FrameHeader h;
  std::string payload;
  ReceivedState received;
  received.transfer_id = transfer_id;
  received.first_page = static_cast<int64_t>(first_page);
  // Sizes are the ticket's (checked above), bounded by the registry's limits.
  received.pages = recycler_->Take(begin.num_pages - received.first_page, begin.page_bytes);
  for (int64_t i = received.first_page; i < begin.num_pages; ++i) {
    RETURN_IF_ERROR(ReadFrameInto(socket, deadline(), received.pages.mutable_page(i - received.first_page), &h));
    RETURN_IF_ERROR(ExpectFrame(h, FrameType::kPage, transfer_id, static_cast<uint64_t>(i)));
  }
  RETURN_IF_ERROR(ReadFrame(socket, deadline(), static_cast<uint64_t>(begin.state_bytes), &h, &received.state));
  RETURN_IF_ERROR(ExpectFrame(h, FrameType::kState, transfer_id, 0));
  if (static_cast<int64_t>(received.state.size()) != begin.state_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("state of transfer ", transfer_id, " has ", received.state.size(),
                                                   " bytes, announced ", begin.state_bytes));
  }
  RETURN_IF_ERROR(ReadFrame(socket, deadline(), kEndPayloadBytes, &h, &payload));
  RETURN_IF_ERROR(ExpectFrame(h, FrameType::kEnd, transfer_id, 0));
  ASSIGN_OR_RETURN(const EndPayload end, DecodeEnd(payload));
  received.first_token = end.first_token;
  received.first_logprob = end.first_logprob;
  return registry_.Complete(transfer_id, std::move(received));  // NOT_FOUND (counted) when forgotten meanwhile
}

// ---- Sender ----

absl::Status TcpStateSender::Send(const Ticket& ticket, const StateSource& source) {
  if (source.num_pages() != ticket.num_pages || source.page_bytes() != ticket.page_bytes ||
      static_cast<int64_t>(source.state().size()) > ticket.max_state_bytes || source.state().empty() ||
      ticket.held_pages < 0 || ticket.held_pages > ticket.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", ticket.transfer_id, ": ", source.num_pages(),
                                                   " pages of ", source.page_bytes(), " bytes and a state of ",
                                                   source.state().size(), " bytes do not fit the ticket (",
                                                   ticket.held_pages, " pages held)"));
  }
  if (ticket.secret.size() != kTransferSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", ticket.transfer_id, ": a ticket secret of ",
                                                   ticket.secret.size(), " bytes, ", kTransferSecretBytes,
                                                   " expected"));
  }
  if (absl::Now() >= ticket.deadline) {
    return absl::DeadlineExceededError(absl::StrCat("transfer ", ticket.transfer_id, " is past its deadline"));
  }
  auto deadline = [&] { return std::min(ticket.deadline, absl::Now() + options_.io_timeout); };
  ASSIGN_OR_RETURN(common::Socket socket,
                   common::Connect(ticket.endpoint, std::min(ticket.deadline, absl::Now() + options_.connect_timeout)));
  if (options_.socket_buffer_bytes > 0) {
    setsockopt(socket.fd(), SOL_SOCKET, SO_SNDBUF, &options_.socket_buffer_bytes, sizeof(options_.socket_buffer_bytes));
  }
  const uint64_t id = ticket.transfer_id;
  // Reads the receiver's verdict; the connection drops right after it. A
  // receiver that does not expect this sender closes without one.
  auto verdict = [&](const absl::Status& write_error) -> absl::Status {
    FrameHeader h;
    std::string payload;
    const absl::Status read = ReadFrame(socket, deadline(), 4 + kMaxAckMessage, &h, &payload);
    if (!read.ok() || h.type != FrameType::kAck) {
      const absl::Status cause = write_error.ok() ? read : write_error;
      if (!absl::IsUnavailable(cause)) return cause;
      return absl::UnavailableError(absl::StrCat(
          "transfer ", id, ": the receiver at ", ticket.endpoint,
          " closed the connection without a verdict (it went away, or it does not expect this transfer from this "
          "sender: cancelled, past its deadline, or another ticket secret): ",
          cause.message()));
    }
    absl::Status carried;
    RETURN_IF_ERROR(DecodeAck(payload, &carried));
    return carried;
  };

  // The begin frame's index: the first page sent (pages before it are held).
  absl::Status s = WriteFrame(socket, FrameType::kBegin, id, static_cast<uint64_t>(ticket.held_pages),
                              EncodeBegin(BeginOf(ticket, source)), deadline());
  // Pages straight from the source's memory where the host can read it,
  // else staged through one page buffer.
  std::string page;
  for (int64_t i = ticket.held_pages; i < source.num_pages() && s.ok(); ++i) {
    absl::StatusOr<std::vector<absl::string_view>> views = source.PageHostViews(i);
    if (views.ok()) {
      s = WriteFrameParts(socket, FrameType::kPage, id, static_cast<uint64_t>(i), *views, deadline());
      continue;
    }
    if (!absl::IsUnimplemented(views.status())) return views.status();  // as a ReadPage failure
    page.resize(static_cast<size_t>(source.page_bytes()));
    s = source.ReadPage(i, absl::MakeSpan(page));
    if (!s.ok()) return s;  // the receiver sees the connection drop and fails the transfer
    s = WriteFrame(socket, FrameType::kPage, id, static_cast<uint64_t>(i), page, deadline());
  }
  if (s.ok()) s = WriteFrame(socket, FrameType::kState, id, 0, source.state(), deadline());
  EndPayload end;
  end.first_token = source.first_token();
  end.first_logprob = source.first_logprob();
  if (s.ok()) s = WriteFrame(socket, FrameType::kEnd, id, 0, EncodeEnd(end), deadline());
  // A receiver that refused early has answered and closed: its verdict says why.
  return verdict(s);
}

}  // namespace hybridserve::transport
