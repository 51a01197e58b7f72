#include "worker/cache_shards.h"

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/socket_io.h"
#include "common/status_macros.h"
#include "worker/cache_stack.h"

namespace hybridserve::worker {

constexpr absl::string_view kDnsScheme = "dns:///";

// What --cachestore and its direct-path flags name, parsed.
struct CacheShards::Source {
  bool dns = false;
  std::string host, port;            // dns: the Service's name and port
  std::vector<std::string> targets;  // static: the list
  std::map<std::string, std::string> shm_by_name;
  std::string bulk_port;  // empty: no bulk path
};

namespace {

absl::StatusOr<std::map<std::string, std::string>> ParseShmSockets(absl::string_view flag) {
  std::map<std::string, std::string> out;
  if (flag.empty()) return out;
  for (absl::string_view pair : absl::StrSplit(flag, ',')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    if (kv.first.empty() || kv.second.empty() || !absl::StrContains(pair, '=')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cachestore_shm_socket: with cachestore shards it is SHARD_NAME=PATH[,SHARD_NAME=PATH], got \"", pair,
          "\""));
    }
    if (!out.emplace(kv.first, kv.second).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cachestore_shm_socket: shard \"", kv.first, "\" is named more than once"));
    }
  }
  return out;
}

absl::StatusOr<std::string> ParseBulkPort(absl::string_view flag) {
  if (flag.empty()) return std::string();
  int port = 0;
  if (flag[0] != ':' || !absl::SimpleAtoi(flag.substr(1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cachestore_bulk_address: with cachestore shards it is :PORT (each shard's bulk port on its own host), "
        "got \"",
        flag, "\""));
  }
  return std::string(flag.substr(1));
}

// The host of a gRPC target ("ipv4:10.0.0.7:50051", "ipv6:[fd00::7]:50051",
// "name:50051") in host:port form with `port`.
std::string WithPort(absl::string_view target, const std::string& port) {
  absl::ConsumePrefix(&target, "ipv4:");
  absl::ConsumePrefix(&target, "ipv6:");
  std::string host, ignored;
  if (!common::SplitHostPort(target, &host, &ignored).ok()) host = std::string(target);
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

}  // namespace

bool CacheShards::NamesShards(absl::string_view address) {
  return absl::StartsWith(address, kDnsScheme) || absl::StrContains(address, ',');
}

CacheShards::CacheShards(const CacheStackOptions& options, std::unique_ptr<Source> source)
    : options_(std::make_unique<const CacheStackOptions>(options)), source_(std::move(source)) {}

CacheShards::~CacheShards() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (resolver_.joinable()) resolver_.join();
}

absl::StatusOr<std::unique_ptr<CacheShards>> CacheShards::Connect(const CacheStackOptions& options) {
  auto source = std::make_unique<Source>();
  absl::string_view address = options.address;
  if (absl::ConsumePrefix(&address, kDnsScheme)) {
    source->dns = true;
    if (!common::SplitHostPort(address, &source->host, &source->port).ok() || source->host.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cachestore: dns:///NAME:PORT names a headless Service, got \"", options.address, "\""));
    }
    if (options.resolve_interval <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("--cachestore_resolve_interval must be > 0, got ",
                                                     absl::FormatDuration(options.resolve_interval)));
    }
  } else {
    for (absl::string_view t : absl::StrSplit(address, ',')) {
      std::string host, port;
      if (!common::SplitHostPort(t, &host, &port).ok() || host.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--cachestore: each shard is host:port, got \"", t, "\" in \"", options.address, "\""));
      }
      if (std::find(source->targets.begin(), source->targets.end(), t) != source->targets.end()) {
        return absl::InvalidArgumentError(absl::StrCat("--cachestore: shard \"", t, "\" is listed more than once"));
      }
      source->targets.emplace_back(t);
    }
  }
  ASSIGN_OR_RETURN(source->shm_by_name, ParseShmSockets(options.shm_socket));
  ASSIGN_OR_RETURN(source->bulk_port, ParseBulkPort(options.bulk_address));
  if (!source->bulk_port.empty() && !options.tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--cachestore_bulk_address reads cache bytes over plain TCP; it cannot be combined with TLS to the "
        "cachestore (drop it: reads then stay on the encrypted gRPC stream)");
  }
  std::unique_ptr<CacheShards> shards(new CacheShards(options, std::move(source)));
  cachestore::ShardedCacheClientOptions so;
  so.probe_interval = options.probe_interval;
  ASSIGN_OR_RETURN(shards->client_, cachestore::ShardedCacheClient::Create({}, so));
  if (!shards->source_->dns) {
    std::map<std::string, Member> members;
    for (const std::string& t : shards->source_->targets) {
      ASSIGN_OR_RETURN(members[t], shards->ConnectShard(t, t));
    }
    absl::MutexLock lock(&shards->mu_);
    RETURN_IF_ERROR(shards->Apply(std::move(members)));
    return shards;
  }
  shards->Resolve();
  shards->resolver_ = std::thread([s = shards.get()] { s->ResolveLoop(); });
  return shards;
}

absl::StatusOr<CacheShards::Member> CacheShards::ConnectShard(const std::string& target,
                                                              const std::string& name) const {
  CacheStackOptions one = *options_;
  one.address = target;
  auto shm = source_->shm_by_name.find(name);
  one.shm_socket = shm != source_->shm_by_name.end() ? shm->second : "";
  one.bulk_address = source_->bulk_port.empty() ? "" : WithPort(target, source_->bulk_port);
  // A resolved address is dialled, but its certificate names the Service.
  if (source_->dns && !one.tls.ca_file.empty() && one.tls.server_name.empty()) one.tls.server_name = source_->host;
  Member m;
  m.name = name;
  ASSIGN_OR_RETURN(std::unique_ptr<CacheStack> stack, CacheStack::Connect(one));
  m.stack = std::move(stack);
  cachestore::GrpcCacheClientOptions po;
  po.timeout = std::min(options_->timeout, options_->probe_timeout);
  po.tls = one.tls;
  ASSIGN_OR_RETURN(std::unique_ptr<cachestore::GrpcCacheClient> probe, cachestore::GrpcCacheClient::Create(target, po));
  m.probe = std::move(probe);
  return m;
}

absl::Status CacheShards::Apply(std::map<std::string, Member> members) {
  std::vector<cachestore::CacheShard> shards;
  for (const auto& [target, m] : members) {
    shards.push_back(cachestore::CacheShard{
        m.name, target, std::shared_ptr<cachestore::CacheClient>(m.stack, m.stack->client()), m.probe});
  }
  RETURN_IF_ERROR(client_->SetShards(std::move(shards)));
  for (const auto& [target, m] : members_) {
    if (members.count(target) != 0) continue;
    LOG(INFO) << "cachestore shard " << m.name << " at " << target << " left the set";
    if (m.stack->direct_reads() != nullptr) {
      const cachestore::DirectReadCounts c = m.stack->direct_reads()->counts();
      cachestore::DirectReadCounts& r = retired_reads_[c.path];
      r.reads += c.reads;
      r.bytes += c.bytes;
      r.verdicts += c.verdicts;
      for (const auto& [reason, n] : c.fallbacks) r.fallbacks[reason] += n;
    }
    if (m.stack->direct_puts() != nullptr) {
      const cachestore::DirectPutCounts c = m.stack->direct_puts()->counts();
      cachestore::DirectPutCounts& r = retired_puts_[c.path];
      r.calls += c.calls;
      r.entries += c.entries;
      r.bytes += c.bytes;
      for (const auto& [reason, n] : c.fallbacks) r.fallbacks[reason] += n;
    }
  }
  members_ = std::move(members);
  return absl::OkStatus();
}

void CacheShards::Resolve() {
  if (!source_->dns) return;
  absl::MutexLock resolving(&resolve_mu_);
  std::map<std::string, Member> current;
  std::set<std::string> were_unanswered;
  {
    absl::MutexLock lock(&mu_);
    current = members_;
    were_unanswered = unanswered_;
  }
  const std::vector<std::string> found = common::ResolveHost(source_->host, source_->port);
  if (found.empty()) {
    LOG(WARNING) << "--cachestore " << options_->address << " resolves to no address; keeping the " << current.size()
                 << " shards known";
    return;
  }
  std::map<std::string, Member> next;
  std::set<std::string> names;
  for (const std::string& target : found) {
    auto it = current.find(target);
    if (it == current.end()) continue;
    names.insert(it->second.name);
    next.emplace(target, it->second);
  }
  std::set<std::string> unanswered;
  for (const std::string& target : found) {
    if (current.count(target) != 0) continue;
    // Asking a new address its name is a call like any other: it has the
    // call timeout (--cache_timeout), not the down-shard prober's shorter
    // one. A pod that leaves out a shard only because its first call over
    // a fresh (TLS) connection was slow would place that shard's chains on
    // the others, and its lookups and publications would disagree with the
    // other pods' until the shard joins.
    cachestore::GrpcCacheClientOptions po;
    po.timeout = options_->timeout;
    po.tls = options_->tls;
    if (!po.tls.ca_file.empty() && po.tls.server_name.empty()) po.tls.server_name = source_->host;
    absl::StatusOr<std::unique_ptr<cachestore::GrpcCacheClient>> ask = cachestore::GrpcCacheClient::Create(target, po);
    absl::StatusOr<cachestore::IndexStats> stats =
        ask.ok() ? (*ask)->Stats() : absl::StatusOr<cachestore::IndexStats>(ask.status());
    if (!stats.ok()) {
      // Logged once while it stays silent: it is asked again every second.
      if (were_unanswered.count(target) == 0) {
        LOG(WARNING) << "cachestore " << target << " (from " << options_->address << ") does not answer ("
                     << stats.status() << "); not a shard until it does (asked again every "
                     << absl::FormatDuration(RetryInterval(1)) << ")";
      }
      unanswered.insert(target);
      continue;
    }
    const std::string name = stats->shard_name.empty() ? target : stats->shard_name;
    if (!names.insert(name).second) {
      LOG(WARNING) << "cachestore " << target << " reports the name \"" << name << "\" of another address; left out";
      continue;
    }
    absl::StatusOr<Member> m = ConnectShard(target, name);
    if (!m.ok()) {
      LOG(WARNING) << "cachestore shard " << name << " at " << target << ": " << m.status();
      continue;
    }
    LOG(INFO) << "cachestore shard " << name << " at " << target << " joins the set";
    next.emplace(target, *std::move(m));
  }
  absl::MutexLock lock(&mu_);
  unanswered_ = std::move(unanswered);
  if (absl::Status s = Apply(std::move(next)); !s.ok()) LOG(WARNING) << "cachestore shards kept: " << s;
}

absl::Duration CacheShards::RetryInterval(int unanswered) const {
  return unanswered > 0 ? std::min(options_->resolve_interval, kUnansweredRetry) : options_->resolve_interval;
}

void CacheShards::ResolveLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), RetryInterval(static_cast<int>(unanswered_.size())));
      if (stopping_) return;
    }
    Resolve();
  }
}

std::string CacheShards::Describe(absl::string_view note) const {
  std::vector<std::string> parts;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [target, m] : members_) {
      const std::string described = m.stack->Describe();  // ", cachestore TARGET[ (path)]"
      absl::string_view d = described;
      absl::ConsumePrefix(&d, ", cachestore ");
      absl::ConsumePrefix(&d, target);
      parts.push_back(absl::StrCat(m.name, m.name == target ? "" : absl::StrCat(" at ", target), d));
    }
  }
  return absl::StrCat(", cachestore shards ", source_->dns ? options_->address : "", source_->dns ? ": " : "",
                      parts.empty() ? "none yet" : absl::StrJoin(parts, ", "), note.empty() ? "" : " (", note,
                      note.empty() ? "" : ")");
}

std::map<std::string, cachestore::DirectReadCounts> CacheShards::ReadCounts() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, cachestore::DirectReadCounts> out = retired_reads_;
  for (const auto& [target, m] : members_) {
    if (m.stack->direct_reads() == nullptr) continue;
    const cachestore::DirectReadCounts c = m.stack->direct_reads()->counts();
    cachestore::DirectReadCounts& r = out[c.path];
    r.path = c.path;
    r.reads += c.reads;
    r.bytes += c.bytes;
    r.verdicts += c.verdicts;
    for (const auto& [reason, n] : c.fallbacks) r.fallbacks[reason] += n;
  }
  for (auto& [path, c] : out) c.path = path;
  return out;
}

std::map<std::string, cachestore::DirectPutCounts> CacheShards::PutCounts() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, cachestore::DirectPutCounts> out = retired_puts_;
  for (const auto& [target, m] : members_) {
    if (m.stack->direct_puts() == nullptr) continue;
    const cachestore::DirectPutCounts c = m.stack->direct_puts()->counts();
    cachestore::DirectPutCounts& r = out[c.path];
    r.calls += c.calls;
    r.entries += c.entries;
    r.bytes += c.bytes;
    for (const auto& [reason, n] : c.fallbacks) r.fallbacks[reason] += n;
  }
  for (auto& [path, c] : out) c.path = path;
  return out;
}

}  // namespace hybridserve::worker
