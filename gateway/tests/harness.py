"""What the gateway's tests share: runfiles, the gateway process, and raw
HTTP calls (status, headers and body as sent: the error shapes are the
contract, so they are read without a client library's interpretation)."""

import http.client
import json
import os

from ready_process import ReadyProcess


def runfile(relative):
    return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "hybridserve"), relative)


def log_dir():
    return os.environ.get("TEST_TMPDIR")


def start_gateway(decode_target, model_dir, *flags, name="gateway", binary=None):
    """The gateway (//gateway:gateway, or `binary`: an argv list) on a free
    port, started and waited for; .port and .base_url set."""
    argv = list(binary) if binary else [runfile("gateway/gateway")]
    argv += ["--decode=" + decode_target, "--model_dir=" + model_dir, "--address=127.0.0.1:0"] + list(flags)
    process = ReadyProcess(name, argv, "GATEWAY_READY", log_dir=log_dir())
    process.port = int(process.fields["port"])
    process.base_url = "http://127.0.0.1:%d/v1" % process.port
    return process


class Reply:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.raw = body
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None

    def error(self):
        """The OpenAI error object of an error reply."""
        assert self.json is not None and "error" in self.json, (self.status, self.raw[:500])
        return self.json["error"]


def request(port, method, path, body=None, headers=None, raw=None, timeout=60):
    """One HTTP/1.1 request on a new connection: Reply(status, headers, bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        all_headers = {"Content-Type": "application/json"}
        all_headers.update(headers or {})
        conn.request(method, path, body=data, headers=all_headers)
        response = conn.getresponse()
        return Reply(response.status, dict(response.getheaders()), response.read())
    finally:
        conn.close()


def sse_events(raw):
    """The data fields of an SSE body, in order (comments and blank lines skipped)."""
    events = []
    for block in raw.decode("utf-8").split("\n\n"):
        data = [line[len("data: "):] for line in block.split("\n") if line.startswith("data: ")]
        if data:
            events.append("\n".join(data))
    return events
