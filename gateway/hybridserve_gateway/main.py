"""The gateway binary: flags, the background refresh, granian in this
process's event loop, SIGTERM's drain.

    hybridserve-gateway --decode=127.0.0.1:50051 --model_dir=DIR [--address=0.0.0.0:8080]
                        [--api_keys=FILE] [--tls_ca=F --tls_cert=F --tls_key=F] ...

Prints `GATEWAY_READY port=N` on stdout once it listens. SIGTERM (or
SIGINT): /health turns 503 and new requests get 503 while the requests in
flight finish (at most --drain_timeout), then it exits 0.

HTTP is granian's (Rust, hyper): its HTTP/1 header read timeout bounds a
client that sends its headers slowly, its buffer bounds their size (431
beyond), and its backpressure bounds the requests served at once (further
connections wait in the accept queue).
"""

import argparse
import asyncio
import logging
import os
import re
import signal
import socket
import sys

from . import app as app_module
from .backend import Decode
from .keys import ApiKeys
from .metrics import Metrics
from .text import Text

_REFRESH_S = 1.0


def duration(value):
    """Seconds of "30s", "5m", "1h", "250ms" or a plain number of seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*", value)
    if not m:
        raise argparse.ArgumentTypeError("%r is not a duration (e.g. 30s, 5m, 250ms)" % value)
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    return float(m.group(1)) * scale


def positive_int(value):
    n = int(value)
    if n <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return n


def parse_flags(argv=None):
    p = argparse.ArgumentParser(prog="hybridserve-gateway", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--address", default="0.0.0.0:8080", help="HTTP listen address (port 0: any free port)")
    p.add_argument("--decode", required=True, help="decode's gRPC target, e.g. dns:///decode:50051")
    p.add_argument("--model_dir", required=True,
                   help="the served model's directory: tokenizer.json, tokenizer_config.json, chat_template.jinja "
                        "(or the byte vocabulary its config.json declares)")
    p.add_argument("--api_keys", default="", help="API keys file (hashed keys and tenants); empty: no "
                                                  "authentication, one tenant")
    p.add_argument("--tls_ca", default="", help="CA bundle (PEM) verifying decode: TLS to decode")
    p.add_argument("--tls_cert", default="", help="the gateway's certificate chain (PEM): mutual TLS, and the "
                                                  "tenant sent as a trusted proxy")
    p.add_argument("--tls_key", default="", help="its private key (PEM)")
    p.add_argument("--tls_server_name", default="", help="the name decode's certificate is checked against")
    p.add_argument("--served_model_name", default="", help="the model's name in the API (default: decode's)")
    p.add_argument("--max_body_bytes", type=positive_int, default=4 << 20, help="request bodies beyond: 413")
    p.add_argument("--max_concurrency", type=positive_int, default=256,
                   help="requests served at once (granian's backpressure); more wait in the accept queue")
    p.add_argument("--backlog", type=positive_int, default=1024, help="the listen socket's accept queue")
    p.add_argument("--max_header_bytes", type=positive_int, default=64 << 10,
                   help="HTTP/1 read buffer: larger request heads are refused (431)")
    p.add_argument("--header_read_timeout", type=duration, default=10.0,
                   help="a client's request head must arrive within this")
    p.add_argument("--body_read_timeout", type=duration, default=30.0,
                   help="a request body must arrive within this (408)")
    p.add_argument("--drain_timeout", type=duration, default=30.0,
                   help="on SIGTERM, requests in flight get this long to finish")
    p.add_argument("--default_max_tokens", type=positive_int, default=2048,
                   help="max_tokens of a request that gives none (capped by the context left)")
    p.add_argument("--log_level", default="info", choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


def split_address(address):
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit("--address=%s: expected HOST:PORT" % address)
    return host.strip("[]"), int(port)


def bind(host, port, backlog):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


async def serve(flags):
    from granian.constants import Interfaces
    from granian.http import HTTP1Settings
    from granian.server.embed import Server

    text = Text(flags.model_dir)
    keys = ApiKeys(flags.api_keys) if flags.api_keys else None
    if keys is None:
        logging.warning("no --api_keys: requests are not authenticated, and all share one tenant")
    else:
        logging.info("api keys: %d keys from %s", len(keys), flags.api_keys)
    decode = Decode(flags.decode, tls_ca=flags.tls_ca or None, tls_cert=flags.tls_cert or None,
                    tls_key=flags.tls_key or None, tls_server_name=flags.tls_server_name or None)
    if decode.tls and not decode.sends_tenant:
        logging.warning("TLS to decode without a client certificate: decode cannot trust the gateway as a "
                        "proxy, so tenants are kept apart by the cache salt only")
    metrics = Metrics()
    gateway = app_module.Gateway(decode, text, metrics, keys, served_model_name=flags.served_model_name or None,
                                 max_body_bytes=flags.max_body_bytes, body_read_timeout_s=flags.body_read_timeout,
                                 default_max_tokens=flags.default_max_tokens)
    application = app_module.create_app(gateway)

    host, port = split_address(flags.address)
    if port == 0:  # pick a free port here, so the READY line can name it
        probe = bind(host, 0, 1)
        port = probe.getsockname()[1]
        probe.close()
    server = Server(application, address=host, port=port, interface=Interfaces.ASGI, backlog=flags.backlog,
                    backpressure=flags.max_concurrency, websockets=False,
                    http1_settings=HTTP1Settings(header_read_timeout=int(flags.header_read_timeout * 1000),
                                                 max_buffer_size=max(flags.max_header_bytes, 8192)),
                    log_enabled=flags.log_level == "debug", log_access=False)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def refresh_forever():
        while True:
            try:
                await gateway.refresh()
            except Exception:  # pylint: disable=broad-except  # keep refreshing whatever one round did
                logging.exception("refresh failed")
            await asyncio.sleep(_REFRESH_S)

    await gateway.refresh()
    refresher = loop.create_task(refresh_forever())
    serving = loop.create_task(server.serve())
    await _wait_listening(host, port, serving)
    print("GATEWAY_READY port=%d" % port, flush=True)
    logging.info("listening on %s:%d, decode %s", host, port, flags.decode)

    stopper = loop.create_task(stop.wait())
    await asyncio.wait({serving, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():  # the server ended by itself: an error
        refresher.cancel()
        serving.result()
        return 1
    gateway.draining = True
    metrics.draining.set(1)
    logging.info("draining: %d requests in flight, up to %gs", gateway.in_flight, flags.drain_timeout)
    try:
        await asyncio.wait_for(gateway.idle.wait(), flags.drain_timeout)
    except asyncio.TimeoutError:
        logging.warning("drain timeout: %d requests still in flight are cut", gateway.in_flight)
    server.stop()
    await serving
    refresher.cancel()
    await decode.close()
    logging.info("stopped")
    return 0


async def _wait_listening(host, port, serving, timeout_s=30.0):
    """Until the port accepts connections (granian binds inside serve())."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    connect_host = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    while True:
        if serving.done():
            serving.result()
            raise SystemExit("the HTTP server stopped while starting")
        try:
            _, writer = await asyncio.open_connection(connect_host, port)
            writer.close()
            return
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise SystemExit("the HTTP server did not listen on %s:%d within %gs" % (host, port, timeout_s))
            await asyncio.sleep(0.02)


def main(argv=None):
    flags = parse_flags(argv)
    logging.basicConfig(level=getattr(logging, flags.log_level.upper()),
                        format="%(asctime)s %(levelname)s gateway: %(message)s", stream=sys.stderr)
    try:
        code = asyncio.run(serve(flags))
    except (ValueError, OSError) as e:
        logging.error("%s", e)
        code = 2
    # Everything is answered, closed and logged by now. Leave without the
    # interpreter's finalization, which would tear down modules under
    # granian's and gRPC's native threads (a crash report, or SIGABRT, at
    # exit instead of the exit status).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
