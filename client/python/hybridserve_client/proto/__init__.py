"""Stubs for proto/generation.proto: `generation_pb2` and `generation_pb2_grpc`.

Under Bazel the genrule //client/python:generation_py_stubs builds them beside
this file; `pip install client/python` builds them into the installed package
(setup.py). Anywhere else (running from a checkout, an editable install) they
are generated on first import, by the same codegen.py, into
`${XDG_CACHE_HOME:-~/.cache}/hybridserve_client/<hash>/`, where the hash covers
the .proto, the generator and the protobuf runtime's version, so an edited
.proto is never served stale stubs. That needs grpcio-tools importable, or
`protoc` and `grpc_python_plugin` on PATH (Debian's protobuf-compiler and
protobuf-compiler-grpc), and the .proto: found at
<repository>/proto/generation.proto, or under $HYBRIDSERVE_PROTO_ROOT when the
package was copied out of the repository.
"""

import hashlib
import importlib.util
import os
import shutil
import tempfile

from . import codegen


def _repository_root():
    # client/python/hybridserve_client/proto/__init__.py -> four levels up.
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", ".."))


def _executable(name):
    path = shutil.which(name)
    if path is None:
        raise ImportError(
            "hybridserve_client: stubs not built and %r not on PATH; pip install "
            "client/python, pip install grpcio-tools, install Debian's protobuf-compiler and "
            "protobuf-compiler-grpc, or run under Bazel" % name)
    return path


def _generated_stub_dir():
    """Returns a directory holding codegen.OUTPUTS, generating them if needed."""
    proto_root = os.environ.get("HYBRIDSERVE_PROTO_ROOT") or _repository_root()
    proto_path = os.path.join(proto_root, "proto", codegen.PROTO_BASENAME + ".proto")
    if not os.path.isfile(proto_path):
        raise ImportError(
            "hybridserve_client: stubs not built and %s not found; set HYBRIDSERVE_PROTO_ROOT "
            "to the directory holding proto/generation.proto" % proto_path)
    if importlib.util.find_spec("grpc_tools") is not None:
        protoc, plugin, generator = codegen.GRPC_TOOLS_PROTOC, None, "grpc_tools"
    else:
        protoc, plugin = _executable("protoc"), _executable("grpc_python_plugin")
        generator = protoc
    import google.protobuf  # the runtime the stubs must match

    digest = hashlib.sha256()
    for path in (proto_path, codegen.__file__):
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(("\0%s\0%s" % (generator, google.protobuf.__version__)).encode())
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    parent = os.path.join(cache_home, "hybridserve_client")
    out_dir = os.path.join(parent, digest.hexdigest()[:16])
    if all(os.path.isfile(os.path.join(out_dir, n)) for n in codegen.OUTPUTS):
        return out_dir

    # Generate into a fresh directory and rename it into place, so concurrent
    # first imports never see half-written files.
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp_", dir=parent)
    try:
        codegen.generate(proto_root, tmp, protoc, plugin)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not os.path.isdir(out_dir):  # not a lost race: a real failure
                raise
    except RuntimeError as e:
        raise ImportError("hybridserve_client: generating stubs failed: %s" % e) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


if importlib.util.find_spec(__name__ + ".generation_pb2") is None:
    __path__.append(_generated_stub_dir())  # noqa: F821 (a package's __path__)

from . import generation_pb2  # noqa: E402
from . import generation_pb2_grpc  # noqa: E402
