#include "common/raw_grpc_call.h"

#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/generic/generic_stub.h"

namespace hybridserve::common {

RawCallResult RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                           const std::string& request, absl::Duration deadline) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1);  // a ByteBuffer with no slice is not a message
  grpc::ByteBuffer out;
  RawCallResult result;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &in, &out, [&](grpc::Status s) {
    result.status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  if (result.status.ok()) {
    std::vector<grpc::Slice> slices;
    if (out.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) result.response.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  if (context.auth_context() != nullptr) {
    for (const grpc::string_ref& v : context.auth_context()->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME)) {
      result.server_pem.assign(v.data(), v.size());
    }
  }
  return result;
}

}  // namespace hybridserve::common
