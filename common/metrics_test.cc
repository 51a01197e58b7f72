#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// What one HTTP exchange must finish within: far above a loopback round trip
// (well under a millisecond), far below civetweb's 30 s request timeout that an
// idle client made a scrape wait for. Not a timing expectation: it turns a hang
// into a failure.
constexpr absl::Duration kExchangeDeadline = absl::Seconds(3);

// A TCP connection to 127.0.0.1:port, or -1.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

struct HttpReply {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
};

// Sends `request` on a fresh connection and reads the reply up to the server's
// close, all within kExchangeDeadline; an error names what did not finish.
absl::StatusOr<HttpReply> Exchange(int port, absl::string_view request) {
  const absl::Time deadline = absl::Now() + kExchangeDeadline;
  const int fd = Connect(port);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot connect to port ", port));
  const timeval send_timeout = absl::ToTimeval(kExchangeDeadline);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("request not sent");
  }
  std::string reply;
  char buf[16384];
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    pollfd p{fd, POLLIN, 0};
    if (left <= absl::ZeroDuration() || poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat(
          "no complete reply within ", absl::FormatDuration(kExchangeDeadline), "; got ", reply.size(), " bytes"));
    }
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t end_of_head = reply.find("\r\n\r\n");
  if (end_of_head == std::string::npos || reply.size() < 12) {
    return absl::DataLossError(absl::StrCat("not an HTTP reply: '", reply, "'"));
  }
  HttpReply out;
  out.head = reply.substr(0, end_of_head);
  out.body = reply.substr(end_of_head + 4);
  if (!absl::SimpleAtoi(absl::string_view(reply).substr(9, 3), &out.status)) {
    return absl::DataLossError(absl::StrCat("no status code in '", out.head, "'"));
  }
  return out;
}

constexpr absl::string_view kScrape = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

// An exposer on a free loopback port serving a registry with one labelled
// counter at 7.
class ExposerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = std::make_shared<prometheus::Registry>();
    prometheus::BuildCounter()
        .Name("hs_test_events_total")
        .Help("Events seen by the test.")
        .Register(*registry_)
        .Add({{"kind", "scrape"}})
        .Increment(7);
    auto exposer = MetricsExposer::Create("127.0.0.1:0", registry_);
    ASSERT_TRUE(exposer.ok()) << exposer.status();
    exposer_ = *std::move(exposer);
  }

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsExposer> exposer_;
};

// The builders register one family each, with its name, help and type; the
// unlabelled ones hold one series without labels.
TEST(MetricsTest, BuildersRegisterNamedFamilies) {
  prometheus::Registry r;
  prometheus::Family<prometheus::Counter>& calls = CounterFamily(r, "t_calls_total", "calls by code");
  calls.Add({{"code", "OK"}}).Increment(2);
  UnlabelledCounter(r, "t_bytes_total", "bytes").Increment(3);
  GaugeFamily(r, "t_free", "free by kind").Add({{"kind", "page"}}).Set(4);
  UnlabelledGauge(r, "t_waiting", "waiting").Set(5);
  UnlabelledHistogram(r, "t_seconds", "seconds", {1, 2}).Observe(1.5);
  const std::vector<prometheus::MetricFamily> families = r.Collect();
  ASSERT_EQ(families.size(), 5u);
  std::map<std::string, const prometheus::MetricFamily*> by_name;
  for (const prometheus::MetricFamily& f : families) by_name[f.name] = &f;
  ASSERT_EQ(by_name.size(), 5u);
  const prometheus::MetricFamily& c = *by_name.at("t_calls_total");
  EXPECT_EQ(c.help, "calls by code");
  EXPECT_EQ(c.type, prometheus::MetricType::Counter);
  ASSERT_EQ(c.metric.size(), 1u);
  ASSERT_EQ(c.metric[0].label.size(), 1u);
  EXPECT_EQ(c.metric[0].label[0].value, "OK");
  EXPECT_EQ(c.metric[0].counter.value, 2);
  const prometheus::MetricFamily& b = *by_name.at("t_bytes_total");
  EXPECT_EQ(b.help, "bytes");
  EXPECT_EQ(b.type, prometheus::MetricType::Counter);
  ASSERT_EQ(b.metric.size(), 1u);
  EXPECT_TRUE(b.metric[0].label.empty());
  EXPECT_EQ(b.metric[0].counter.value, 3);
  EXPECT_EQ(by_name.at("t_free")->type, prometheus::MetricType::Gauge);
  EXPECT_EQ(by_name.at("t_free")->metric[0].gauge.value, 4);
  EXPECT_EQ(by_name.at("t_waiting")->type, prometheus::MetricType::Gauge);
  EXPECT_TRUE(by_name.at("t_waiting")->metric[0].label.empty());
  EXPECT_EQ(by_name.at("t_waiting")->metric[0].gauge.value, 5);
  const prometheus::MetricFamily& h = *by_name.at("t_seconds");
  EXPECT_EQ(h.type, prometheus::MetricType::Histogram);
  ASSERT_EQ(h.metric[0].histogram.bucket.size(), 3u);  // 1, 2, +Inf
  EXPECT_EQ(h.metric[0].histogram.bucket[0].cumulative_count, 0u);
  EXPECT_EQ(h.metric[0].histogram.bucket[1].cumulative_count, 1u);
}

// A cumulative count copied in before each scrape: the counter gains what
// the count gained, and nothing when it did not grow.
TEST(MetricsTest, AdvanceCounterAddsWhatTheCountGained) {
  prometheus::Registry r;
  prometheus::Counter& c = UnlabelledCounter(r, "t_total", "t");
  AdvanceCounter(c, 5, 0);
  EXPECT_EQ(c.Value(), 5);
  AdvanceCounter(c, 5, 5);
  EXPECT_EQ(c.Value(), 5);
  AdvanceCounter(c, 7.5, 5);
  EXPECT_EQ(c.Value(), 7.5);
  AdvanceCounter(c, 3, 7.5);  // a count that went back adds nothing
  EXPECT_EQ(c.Value(), 7.5);

  prometheus::Family<prometheus::Counter>& f = CounterFamily(r, "t_by_reason_total", "t");
  AdvanceByKey(f, {{"path", "shm"}}, "reason", {{"UNAVAILABLE", 2}, {"DATA_LOSS", 0}}, {});
  AdvanceByKey(f, {{"path", "shm"}}, "reason", {{"UNAVAILABLE", 5}, {"DATA_LOSS", 1}},
               {{"UNAVAILABLE", 2}, {"DATA_LOSS", 0}});
  EXPECT_EQ(f.Add({{"path", "shm"}, {"reason", "UNAVAILABLE"}}).Value(), 5);
  EXPECT_EQ(f.Add({{"path", "shm"}, {"reason", "DATA_LOSS"}}).Value(), 1);
}

TEST(MetricsTest, ExponentialBuckets) { EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8})); }

TEST(MetricsTest, ExposerBindsFreePortAndReportsIt) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto exposer = MetricsExposer::Create("127.0.0.1:0", registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  EXPECT_GT((*exposer)->port(), 0);
}

// The services bind the wildcard address; a scrape on loopback reaches it.
TEST(MetricsTest, ExposerOnTheWildcardAddressAnswersOnLoopback) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto exposer = MetricsExposer::Create("0.0.0.0:0", registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  absl::StatusOr<HttpReply> reply = Exchange((*exposer)->port(), kScrape);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200) << reply->head;
}

// An address that cannot be parsed is the caller's mistake: INVALID_ARGUMENT
// naming it, before any socket is opened.
TEST(MetricsTest, ExposerReportsUnparsableBindAsInvalidArgument) {
  auto registry = std::make_shared<prometheus::Registry>();
  for (const std::string bind : {"not-an-address:99999", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", ":9100x",
                                 "no-such-host.invalid:0", "[::1:0"}) {
    auto exposer = MetricsExposer::Create(bind, registry);
    EXPECT_EQ(exposer.status().code(), absl::StatusCode::kInvalidArgument) << bind;
    EXPECT_THAT(exposer.status().message(), HasSubstr("metrics exposer cannot bind " + bind)) << bind;
  }
}

// A port another exposer holds is refused with a status naming the address,
// not shared and not thrown.
TEST(MetricsTest, ExposerRefusesATakenPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsExposer::Create("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = MetricsExposer::Create(taken, registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("metrics exposer cannot bind " + taken));
}

// Destroying an exposer closes its listening socket: the port can be bound
// again at once (SO_REUSEADDR covers connections left in TIME_WAIT).
TEST(MetricsTest, DestroyedExposerFreesItsPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsExposer::Create("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*first)->port());
  ASSERT_TRUE(Exchange((*first)->port(), kScrape).ok());
  first->reset();
  auto second = MetricsExposer::Create(address, registry);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(absl::StrCat("127.0.0.1:", (*second)->port()), address);
}

// before_scrape runs before every scrape collects: what it sets is in that
// scrape's answer.
TEST(MetricsTest, BeforeScrapeRefreshesTheRegistryForThatScrape) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Gauge& gauge =
      prometheus::BuildGauge().Name("hs_test_synced").Help("Synced.").Register(*registry).Add({});
  std::atomic<int> scrapes{0};
  auto exposer = MetricsExposer::Create("127.0.0.1:0", registry, [&] { gauge.Set(++scrapes * 10); });
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  for (int i = 1; i <= 2; ++i) {
    absl::StatusOr<HttpReply> reply = Exchange((*exposer)->port(), kScrape);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_THAT(reply->body, HasSubstr(absl::StrCat("\nhs_test_synced ", 10 * i, "\n")));
  }
  EXPECT_EQ(scrapes.load(), 2);
}

// A scrape gets 200, the Prometheus text format's content type and the
// registry's counter with its exact value.
TEST_F(ExposerTest, ScrapeReturnsTheRegistrysCounter) {
  absl::StatusOr<HttpReply> reply = Exchange(exposer_->port(), kScrape);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200) << reply->head;
  EXPECT_THAT(reply->head, HasSubstr("\r\nContent-Type: text/plain; version=0.0.4\r\n"));
  EXPECT_THAT(reply->body, HasSubstr("# TYPE hs_test_events_total counter\n"));
  EXPECT_THAT(reply->body, HasSubstr("\nhs_test_events_total{kind=\"scrape\"} 7\n"));
}

// The registry is read at each scrape, not when the exposer was made.
TEST_F(ExposerTest, ScrapeSeesAnUpdateMadeAfterCreate) {
  prometheus::BuildGauge().Name("hs_test_level").Help("A level.").Register(*registry_).Add({}).Set(42);
  absl::StatusOr<HttpReply> reply = Exchange(exposer_->port(), kScrape);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_THAT(reply->body, HasSubstr("\nhs_test_level 42\n"));
}

// HEAD gets the scrape's status and headers without the body.
TEST_F(ExposerTest, HeadGetsHeadersWithoutTheBody) {
  absl::StatusOr<HttpReply> reply =
      Exchange(exposer_->port(), "HEAD /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200) << reply->head;
  EXPECT_THAT(reply->head, HasSubstr("\r\nContent-Type: text/plain; version=0.0.4\r\n"));
  EXPECT_EQ(reply->body, "");
}

TEST_F(ExposerTest, OtherPathIsNotFound) {
  absl::StatusOr<HttpReply> reply =
      Exchange(exposer_->port(), "GET /other HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 404) << reply->head;
  EXPECT_THAT(reply->body, Not(HasSubstr("hs_test_events_total")));
}

TEST_F(ExposerTest, PostIsMethodNotAllowed) {
  absl::StatusOr<HttpReply> reply =
      Exchange(exposer_->port(),
               "POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 405) << reply->head;
  EXPECT_THAT(reply->head, HasSubstr("\r\nAllow: GET, HEAD"));
  EXPECT_THAT(reply->body, Not(HasSubstr("hs_test_events_total")));
}

// A request line that outgrows the per-connection memory (32 KiB) is refused
// and its connection closed, so a client cannot make the server hold more.
TEST_F(ExposerTest, OversizedRequestIsRefused) {
  const std::string request = absl::StrCat("GET /", std::string(40000, 'a'), " HTTP/1.1\r\n\r\n");
  absl::StatusOr<HttpReply> reply = Exchange(exposer_->port(), request);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 414) << reply->head;
}

// The starvation the exposer exists to prevent: 64 clients that connect and
// send nothing, and 8 that send a request line one byte every 200 ms, are all
// open while 5 scrapes in a row each finish within kExchangeDeadline. (With
// prometheus-cpp's civetweb Exposer every scrape here waited for a worker
// thread that the idle clients held for 30 s.)
TEST_F(ExposerTest, IdleAndSlowClientsDoNotDelayAScrape) {
  constexpr int kIdle = 64;
  constexpr int kSlow = 8;
  std::vector<int> idle;
  std::vector<int> slow;
  const auto close_all = absl::MakeCleanup([&] {
    for (int fd : idle) close(fd);
    for (int fd : slow) close(fd);
  });
  for (int i = 0; i < kIdle; ++i) {
    idle.push_back(Connect(exposer_->port()));
    ASSERT_GE(idle.back(), 0) << "idle connection " << i;
  }
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(Connect(exposer_->port()));
    ASSERT_GE(slow.back(), 0) << "slow connection " << i;
  }

  // One thread feeds every slow client a byte each 200 ms: "GET /met", then
  // more of an ever longer path, until the test ends (also when an assertion
  // below returns early).
  absl::Notification stop;
  absl::Notification three_bytes_sent;
  std::thread feeder([&] {
    const std::string start = "GET /met";
    for (size_t i = 0; !stop.HasBeenNotified(); ++i) {
      const char byte = i < start.size() ? start[i] : 'a';
      for (int fd : slow) send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (i == 2) three_bytes_sent.Notify();
      stop.WaitForNotificationWithTimeout(absl::Milliseconds(200));
    }
  });
  const auto stop_feeder = absl::MakeCleanup([&] {
    stop.Notify();
    feeder.join();
  });
  three_bytes_sent.WaitForNotification();

  for (int scrape = 0; scrape < 5; ++scrape) {
    absl::StatusOr<HttpReply> reply = Exchange(exposer_->port(), kScrape);
    ASSERT_TRUE(reply.ok()) << "scrape " << scrape << ": " << reply.status();
    EXPECT_EQ(reply->status, 200) << reply->head;
    EXPECT_THAT(reply->body, HasSubstr("\nhs_test_events_total{kind=\"scrape\"} 7\n"));
  }
}

// A client that connects and stays silent loses its connection (and the server
// its fd) after kConnectionTimeout. The wait's bound is generous; only the
// server's close is asserted.
TEST_F(ExposerTest, SilentConnectionIsClosedAfterTheTimeout) {
  const int fd = Connect(exposer_->port());
  ASSERT_GE(fd, 0);
  const auto close_fd = absl::MakeCleanup([fd] { close(fd); });
  pollfd p{fd, POLLIN, 0};
  const absl::Duration bound = MetricsExposer::kConnectionTimeout + absl::Seconds(25);
  ASSERT_EQ(poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(bound))), 1)
      << "still open after " << absl::FormatDuration(bound);
  char byte;
  EXPECT_EQ(recv(fd, &byte, 1, 0), 0) << "expected the server's close (end of stream)";
}

}  // namespace
}  // namespace hybridserve::common
