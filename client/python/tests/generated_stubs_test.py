"""The stubs generated at build time agree with proto/generation.proto.

Parses the .proto's text (messages, their fields, enums, the service) and
compares it with the generated module's descriptor, so stale or unwired stubs
fail here. Under Bazel it also checks the stubs are the genrule's outputs,
not ones generated at import into a cache directory.
"""

import os
import re
import unittest

import hybridserve_client.proto
from hybridserve_client.proto import generation_pb2


def _proto_path():
    if "TEST_SRCDIR" in os.environ:  # under bazel test
        return os.path.join(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], "proto",
                            "generation.proto")
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "..", "proto", "generation.proto")


_BLOCK = re.compile(r"^(message|enum|service) (\w+) \{(\})?$")
_FIELD = re.compile(r"^(optional |repeated )?([\w.]+) (\w+) = (\d+);$")
_ENUM_VALUE = re.compile(r"^(\w+) = (\d+);$")
_RPC = re.compile(r"^rpc (\w+)\((\w+)\) returns \((stream )?(\w+)\);$")


def _parse(text):
    """Top-level messages {name: {field: (number, label)}}, enums {name: {value: n}},
    rpcs {name: (input, output, server_streaming)}. Enough of proto3 for this file."""
    messages, enums, rpcs = {}, {}, {}
    kind = name = None
    depth = 0
    for line in text.splitlines():
        line = line.split("//")[0].strip()
        if not line:
            continue
        if depth == 0:
            m = _BLOCK.match(line)
            if m:
                kind, name, closed = m.groups()
                if kind == "message":
                    messages[name] = {}
                elif kind == "enum":
                    enums[name] = {}
                depth = 0 if closed else 1
            continue
        if line.endswith("{"):  # a oneof: its fields belong to the message
            depth += 1
        elif line == "}":
            depth -= 1
        elif kind == "message" and _FIELD.match(line):
            label, _, field, number = _FIELD.match(line).groups()
            messages[name][field] = (int(number), (label or "").strip())
        elif kind == "enum" and _ENUM_VALUE.match(line):
            value, number = _ENUM_VALUE.match(line).groups()
            enums[name][value] = int(number)
        elif kind == "service" and _RPC.match(line):
            rpc, request, stream, response = _RPC.match(line).groups()
            rpcs[rpc] = (request, response, stream is not None)
    return messages, enums, rpcs


class GeneratedStubsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        with open(_proto_path(), encoding="utf-8") as f:
            cls.messages, cls.enums, cls.rpcs = _parse(f.read())

    def test_the_parse_found_the_contract(self):
        # Guards the parser itself: a parse that found nothing would pass the rest.
        self.assertIn("GenerateRequest", self.messages)
        self.assertEqual(self.messages["GenerateResponse"], {"chunk": (1, ""), "complete": (2, "")})
        self.assertEqual(self.rpcs["Generate"], ("GenerateRequest", "GenerateResponse", True))
        self.assertEqual(self.enums["FinishReason"]["FINISH_REASON_ERROR"], 4)

    def test_messages_and_fields_match_the_proto(self):
        descriptor = generation_pb2.DESCRIPTOR
        self.assertEqual(descriptor.name, "proto/generation.proto")
        self.assertEqual(descriptor.package, "hybridserve.v1")
        self.assertEqual(set(descriptor.message_types_by_name), set(self.messages))
        for name, fields in self.messages.items():
            with self.subTest(message=name):
                message = descriptor.message_types_by_name[name]
                got = {}
                for f in message.fields:
                    label = "repeated" if f.label == f.LABEL_REPEATED else ""
                    if f.containing_oneof is not None and f.containing_oneof.name.startswith("_"):
                        label = "optional"  # proto3 optional: a synthetic oneof
                    got[f.name] = (f.number, label)
                self.assertEqual(got, fields)

    def test_enums_match_the_proto(self):
        descriptor = generation_pb2.DESCRIPTOR
        self.assertEqual(set(descriptor.enum_types_by_name), set(self.enums))
        for name, values in self.enums.items():
            with self.subTest(enum=name):
                got = {v.name: v.number for v in descriptor.enum_types_by_name[name].values}
                self.assertEqual(got, values)

    def test_service_methods_match_the_proto(self):
        service = generation_pb2.DESCRIPTOR.services_by_name["Generation"]
        got = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming)
               for m in service.methods}
        self.assertEqual(got, self.rpcs)
        self.assertEqual(list(self.rpcs), ["Generate", "Abort", "GetModelInfo"])

    @unittest.skipUnless("TEST_SRCDIR" in os.environ, "only under bazel test")
    def test_stubs_are_the_genrule_outputs(self):
        package_dir = os.path.dirname(hybridserve_client.proto.__file__)
        self.assertEqual(os.path.dirname(generation_pb2.__file__), package_dir)


if __name__ == "__main__":
    unittest.main()
