"""Build hook of the hybridserve-client package (pyproject.toml holds the rest).

build_py writes hybridserve_client/proto/generation_pb2(_grpc).py into the
build directory (never into the source tree, where Bazel's genrule puts its
own), generated from proto/generation.proto by grpcio-tools' protoc through
hybridserve_client/proto/codegen.py, the script Bazel runs too. The .proto is
found at $HYBRIDSERVE_PROTO_ROOT/proto/generation.proto, else in the
repository this directory belongs to (../../proto), else in an sdist's copy
(sdist below puts it there).

The runtime requirements follow the generator: stubs from grpcio-tools X
check at import that grpcio >= X, and the message code checks that protobuf is
at least its own gencode version and of the same major version, so the floors
are this build's grpcio-tools and protobuf versions.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join("proto", "generation.proto")
SDIST_PROTO_ROOT = "_proto_root"  # an sdist's copy of the .proto, under this directory


def _proto_root():
    candidates = [os.environ.get("HYBRIDSERVE_PROTO_ROOT"), os.path.join(HERE, "..", ".."),
                  os.path.join(HERE, SDIST_PROTO_ROOT)]
    for root in candidates:
        if root and os.path.isfile(os.path.join(root, PROTO)):
            return os.path.normpath(root)
    sys.exit("hybridserve-client: %s not found (looked under %s). Build from the hybridserve "
             "repository (pip install ./client/python), or set HYBRIDSERVE_PROTO_ROOT to the "
             "directory that holds proto/generation.proto." % (PROTO, ", ".join(os.path.normpath(r) for r in candidates if r)))


def _codegen():
    sys.path.insert(0, os.path.join(HERE, "hybridserve_client", "proto"))
    try:
        import codegen  # standard library only: no package import
    finally:
        sys.path.pop(0)
    return codegen


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        codegen = _codegen()
        out_dir = os.path.join(self.build_lib, "hybridserve_client", "proto")
        try:
            codegen.generate(_proto_root(), out_dir, codegen.GRPC_TOOLS_PROTOC, None)
        except RuntimeError as e:
            sys.exit("hybridserve-client: generating the gRPC stubs failed: %s" % e)


class SdistWithProto(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = os.path.join(base_dir, SDIST_PROTO_ROOT, "proto")
        os.makedirs(target, exist_ok=True)
        self.copy_file(os.path.join(_proto_root(), PROTO), target)


def _runtime_requirements():
    try:
        from importlib.metadata import version
        tools, protobuf = version("grpcio-tools"), version("protobuf")
    except Exception:  # metadata asked for before the build requirements are installed
        return ["grpcio", "protobuf"]
    major = int(protobuf.split(".")[0])
    return ["grpcio>=%s" % tools, "protobuf>=%s,<%d" % (protobuf, major + 1)]


setup(
    install_requires=_runtime_requirements(),
    cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto},
)
