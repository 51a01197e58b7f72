"""hs_proto_library: C++ protobuf + gRPC code generation with Debian's protoc."""

load("//third_party:copts.bzl", "HS_GENERATED_COPTS")

def hs_proto_library(name, srcs, deps = [], grpc = True, visibility = None):
    """Generates message and (optionally) gRPC service code for `srcs`.

    Args:
      name: the cc_library to create; depend on it to include
        "<package>/<file>.pb.h" and "<package>/<file>.grpc.pb.h".
      srcs: .proto files in this package.
      deps: other hs_proto_library targets whose .proto files these import.
      grpc: whether to run grpc_cpp_plugin too.
      visibility: visibility of the cc_library.
    """
    pkg = native.package_name()
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]

    proto_deps = [d + "_protos" for d in deps]
    native.filegroup(
        name = name + "_protos",
        srcs = srcs + proto_deps,
        visibility = visibility,
    )

    plugin = ""
    grpc_out = ""
    if grpc:
        plugin = "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin"
        grpc_out = "--grpc_out=$(GENDIR)"
    native.genrule(
        name = name + "_gen",
        srcs = srcs + proto_deps,
        outs = outs,
        cmd = " ".join([
            "/usr/bin/protoc",
            "-I.",
            "--cpp_out=$(GENDIR)",
            grpc_out,
            plugin,
        ] + ["%s/%s" % (pkg, s) if pkg else s for s in srcs]),
    )

    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        copts = HS_GENERATED_COPTS,
        deps = deps + (["//third_party:grpc"] if grpc else ["//third_party:protobuf"]),
        visibility = visibility,
    )
