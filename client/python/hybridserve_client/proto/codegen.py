"""Generates the Python message and gRPC stubs for proto/generation.proto.

One implementation for every caller: Bazel's genrule (at build time, with
Debian's protoc and grpc_python_plugin, see client/python/BUILD.bazel), the
package's build (`pip install client/python`: setup.py, with grpcio-tools'
protoc) and hybridserve_client.proto (at first import, outside Bazel and pip,
into a cache directory). Runs protoc, then makes the stubs importable as
hybridserve_client.proto.generation_pb2(_grpc).

Why the rewrite: protoc names the gRPC stub's import after the .proto path,
`from proto import generation_pb2`, which needs a top-level package called
`proto`. That name is taken by proto-plus (installed with Google's cloud
libraries), so the stubs live inside our package and the one import becomes
relative. The .proto keeps its canonical name, proto/generation.proto, in the
descriptor pool.

Standard library only: it runs as a script in the genrule.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

PROTO_BASENAME = "generation"
OUTPUTS = (PROTO_BASENAME + "_pb2.py", PROTO_BASENAME + "_pb2_grpc.py")
# The line grpc_python_plugin writes for proto/generation.proto.
_ABSOLUTE_IMPORT = re.compile(r"^from proto import (\w+_pb2) as ", re.MULTILINE)


# grpcio-tools' protoc: its gRPC generator is built in, and run as a module it
# adds its bundled well-known types (google/protobuf/duration.proto) to -I.
GRPC_TOOLS_PROTOC = (sys.executable, "-m", "grpc_tools.protoc")


def generate(proto_root, out_dir, protoc="protoc", grpc_plugin="grpc_python_plugin"):
    """Writes OUTPUTS into out_dir (created if missing).

    Args:
      proto_root: the directory holding proto/generation.proto (the repository
        root), passed to protoc as -I so the file keeps its canonical name.
      out_dir: where generation_pb2.py and generation_pb2_grpc.py go.
      protoc: an executable (a path, or a name looked up on PATH), or a
        command as a sequence, e.g. GRPC_TOOLS_PROTOC.
      grpc_plugin: the grpc_python_plugin executable; None for a protoc with
        the gRPC generator built in (GRPC_TOOLS_PROTOC).

    Raises:
      RuntimeError: protoc failed or its output is not what this module
        expects (a protoc or plugin of another shape).
    """
    with tempfile.TemporaryDirectory(prefix="hs_codegen_") as tmp:
        cmd = [protoc] if isinstance(protoc, str) else list(protoc)
        cmd += ["-I" + proto_root, "--python_out=" + tmp, "--grpc_python_out=" + tmp]
        if grpc_plugin is not None:
            cmd.append("--plugin=protoc-gen-grpc_python=" + grpc_plugin)
        cmd.append(os.path.join(proto_root, "proto", PROTO_BASENAME + ".proto"))
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError("%s failed (exit %d): %s" % (" ".join(cmd), done.returncode, done.stderr.strip()))

        os.makedirs(out_dir, exist_ok=True)
        for name in OUTPUTS:
            with open(os.path.join(tmp, "proto", name), encoding="utf-8") as f:
                text = f.read()
            if name.endswith("_grpc.py"):
                text, n = _ABSOLUTE_IMPORT.subn(r"from . import \1 as ", text)
                if n != 1:
                    raise RuntimeError("expected one 'from proto import ..._pb2' line in %s, found %d" % (name, n))
            with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
                f.write(text)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto_root", required=True, help="directory holding proto/generation.proto")
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--protoc", default="protoc")
    parser.add_argument("--grpc_plugin", default="grpc_python_plugin")
    parser.add_argument("--grpc_tools", action="store_true",
                        help="use grpcio-tools' protoc (ignores --protoc and --grpc_plugin)")
    args = parser.parse_args(argv)
    try:
        if args.grpc_tools:
            generate(args.proto_root, args.out_dir, GRPC_TOOLS_PROTOC, None)
        else:
            generate(args.proto_root, args.out_dir, args.protoc, args.grpc_plugin)
    except RuntimeError as e:
        print("codegen: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
