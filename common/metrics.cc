#include "common/metrics.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/log_rate_limiter.h"
#include "prometheus/text_serializer.h"

namespace hybridserve::common {

// The daemon thread's view of an exposer: refresh, then collect.
struct MetricsExposerAccess {
  static std::string Scrape(const MetricsExposer& e) {
    if (e.before_scrape_) e.before_scrape_();
    return prometheus::TextSerializer().Serialize(e.registry_->Collect());
  }
};

namespace {

// Per-connection buffer for the request line and headers; a request that
// outgrows it is refused and its connection closed (libmicrohttpd's default).
constexpr size_t kConnectionMemoryBytes = 32 * 1024;

constexpr char kMetricsPath[] = "/metrics";
constexpr char kTextFormat[] = "text/plain; version=0.0.4";

// Queues a reply with `body` (copied) and `content_type`.
MHD_Result Reply(MHD_Connection* connection, unsigned int status, absl::string_view body, const char* content_type,
                 const char* allow = nullptr) {
  MHD_Response* response =
      MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;  // out of memory: the connection is closed
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  if (allow != nullptr) MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, allow);
  const MHD_Result queued = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return queued;
}

// libmicrohttpd's request handler, on the daemon's thread; `cls` is the
// exposer's registry. Answers on the first call, once the headers are in; a
// request body (never expected) is not read and its connection is closed after
// the reply.
MHD_Result HandleRequest(void* cls, MHD_Connection* connection, const char* url, const char* method,
                         const char* /*version*/, const char* /*upload_data*/, size_t* /*upload_data_size*/,
                         void** /*con_cls*/) {
  const absl::string_view m = method;
  if (m != MHD_HTTP_METHOD_GET && m != MHD_HTTP_METHOD_HEAD) {
    return Reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: metrics are read with GET\n",
                 "text/plain", "GET, HEAD");
  }
  if (absl::string_view(url) != kMetricsPath) {
    return Reply(connection, MHD_HTTP_NOT_FOUND, "not found: metrics are at /metrics\n", "text/plain");
  }
  const MetricsExposer& exposer = *static_cast<const MetricsExposer*>(cls);
  const std::string text = MetricsExposerAccess::Scrape(exposer);
  return Reply(connection, MHD_HTTP_OK, text, kTextFormat);
}

struct SplitAddress {
  std::string host;  // numeric, without IPv6 brackets
  std::string port;  // digits, 0..65535
};

// "host:port" or "[v6-host]:port" -> its parts; an error says what is wrong.
absl::StatusOr<SplitAddress> Split(absl::string_view bind) {
  const size_t colon = bind.rfind(':');
  if (colon == absl::string_view::npos) return absl::InvalidArgumentError("expected host:port");
  absl::string_view host = bind.substr(0, colon);
  const absl::string_view port = bind.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos || host.find('[') != absl::string_view::npos) {
    return absl::InvalidArgumentError("an IPv6 host is written in brackets: [::1]:9100");
  }
  if (host.empty()) return absl::InvalidArgumentError("expected host:port, the host is empty");
  int port_number = -1;
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](char c) { return absl::ascii_isdigit(c); });
  if (!digits || !absl::SimpleAtoi(port, &port_number) || port_number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port '", port, "' is not a number in 0..65535"));
  }
  return SplitAddress{std::string(host), std::string(port)};
}

// A listening, non-blocking TCP socket bound to `bind` with SO_REUSEADDR (a
// restart may rebind while old connections linger in TIME_WAIT) and without
// SO_REUSEPORT (a port another process serves is refused, not shared).
absl::StatusOr<int> Listen(const std::string& bind) {
  absl::StatusOr<SplitAddress> parts = Split(bind);
  if (!parts.ok()) return parts.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(parts->host.c_str(), parts->port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host '", parts->host, "' is not a numeric IPv4 or IPv6 address (", gai_strerror(rc), ")"));
  }
  const addrinfo address = *found;  // numeric host: exactly one answer
  const int fd = socket(address.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  std::string failed;
  if (fd < 0) {
    failed = "socket";
  } else if (const int on = 1; setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0) {
    failed = "SO_REUSEADDR";
  } else if (::bind(fd, address.ai_addr, address.ai_addrlen) != 0) {
    failed = "bind";
  } else if (listen(fd, SOMAXCONN) != 0) {
    failed = "listen";
  }
  const int error = errno;
  freeaddrinfo(found);
  if (!failed.empty()) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat(failed, ": ", std::strerror(error)));
  }
  return fd;
}

// The port `fd` is bound to, or 0.
int BoundPort(int fd) {
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) return 0;
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  return 0;
}

}  // namespace

prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry, const std::string& name,
                                                       const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry, const std::string& name,
                                                   const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

prometheus::Counter& UnlabelledCounter(prometheus::Registry& registry, const std::string& name,
                                       const std::string& help) {
  return CounterFamily(registry, name, help).Add({});
}

prometheus::Gauge& UnlabelledGauge(prometheus::Registry& registry, const std::string& name, const std::string& help) {
  return GaugeFamily(registry, name, help).Add({});
}

prometheus::Histogram& UnlabelledHistogram(prometheus::Registry& registry, const std::string& name,
                                           const std::string& help, std::vector<double> buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add({}, std::move(buckets));
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  out.reserve(count);
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

void AdvanceByKey(prometheus::Family<prometheus::Counter>& family, const prometheus::Labels& labels,
                  const std::string& label, const std::map<std::string, int64_t>& now,
                  const std::map<std::string, int64_t>& last) {
  for (const auto& [key, n] : now) {
    auto before = last.find(key);
    prometheus::Labels with_key = labels;
    with_key[label] = key;
    AdvanceCounter(family.Add(with_key), static_cast<double>(n),
                   static_cast<double>(before == last.end() ? 0 : before->second));
  }
}

void AdvanceCounter(prometheus::Counter& counter, double now, double last) {
  if (now > last) counter.Increment(now - last);
}

void DeclareFailureReasons(prometheus::Family<prometheus::Counter>& family, const prometheus::Labels& labels,
                           const std::string& label) {
  for (int code = static_cast<int>(absl::StatusCode::kCancelled);
       code <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++code) {
    prometheus::Labels with_reason = labels;
    with_reason[label] = FailureReason(absl::Status(static_cast<absl::StatusCode>(code), ""));
    family.Add(with_reason);
  }
}

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Create(const std::string& bind,
                                                                       std::shared_ptr<prometheus::Registry> registry,
                                                                       std::function<void()> before_scrape) {
  absl::StatusOr<int> fd = Listen(bind);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(),
                        absl::StrCat("metrics exposer cannot bind ", bind, ": ", fd.status().message()));
  }
  std::unique_ptr<MetricsExposer> exposer(
      new MetricsExposer(std::move(registry), std::move(before_scrape), BoundPort(*fd)));
  // The daemon owns the listening socket from here: it closes it when stopped,
  // and also when it fails to start after taking it (libmicrohttpd 0.9.75,
  // checked with a thread that cannot be created), so a failure below does not
  // close it a second time (that could close a descriptor opened since).
  exposer->daemon_ = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0, nullptr, nullptr,
                                      &HandleRequest, exposer.get(), MHD_OPTION_LISTEN_SOCKET,
                                      static_cast<MHD_socket>(*fd), MHD_OPTION_CONNECTION_LIMIT,
                                      static_cast<unsigned int>(kMaxConnections), MHD_OPTION_CONNECTION_TIMEOUT,
                                      static_cast<unsigned int>(absl::ToInt64Seconds(kConnectionTimeout)),
                                      MHD_OPTION_CONNECTION_MEMORY_LIMIT, kConnectionMemoryBytes, MHD_OPTION_END);
  if (exposer->daemon_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("metrics exposer cannot bind ", bind, ": libmicrohttpd did not start its HTTP daemon"));
  }
  return exposer;
}

MetricsExposer::~MetricsExposer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace hybridserve::common
