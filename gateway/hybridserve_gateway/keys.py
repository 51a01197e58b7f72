"""API keys: a file of hashed keys, each naming its tenant, reloaded when it changes.

The file (--api_keys), one key per line, `#` comments and blank lines ignored:

    sha256:<64 lowercase hex digits: SHA-256 of the key's UTF-8 bytes> <tenant>

Keys are never stored in clear: a request's bearer key is hashed and looked
up. A key is long and random (say 32 bytes from a CSPRNG), so an unsalted
hash is enough: there is no dictionary to try. Print a line for a key:

    python3 -m hybridserve_gateway.keys hash --tenant=acme KEY
    python3 -m hybridserve_gateway.keys new --tenant=acme     # a fresh random key and its line

Reload: check() compares the file's identity (inode, size, mtime; the path is
followed, so a Kubernetes Secret volume's symlink swap counts) and re-reads it
when it changed. A file that no longer parses keeps the keys loaded before
(logged): a bad edit never locks every client out, nor lets anyone in.
"""

import argparse
import hashlib
import logging
import os
import re
import secrets
import sys

_LINE = re.compile(r"^sha256:([0-9a-f]{64})\s+(\S+)$")
MAX_TENANT_BYTES = 256  # cachestore::kMaxTenantBytes: decode refuses a longer tenant


def hash_key(key):
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def parse(text, source="api keys"):
    """{sha256 hex: tenant} of a keys file's text.

    Raises:
      ValueError: a line that is not `sha256:<hex> <tenant>`, a tenant too
        long, or one hash listed twice; naming the line.
    """
    keys = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError("%s line %d: expected `sha256:<64 lowercase hex> <tenant>`" % (source, number))
        digest, tenant = m.groups()
        if len(tenant.encode("utf-8")) > MAX_TENANT_BYTES:
            raise ValueError("%s line %d: tenant longer than %d bytes" % (source, number, MAX_TENANT_BYTES))
        if digest in keys:
            raise ValueError("%s line %d: this key's hash is listed twice" % (source, number))
        keys[digest] = tenant
    return keys


class ApiKeys:
    """The keys file, loaded at construction (raises when it does not parse)
    and re-read by check(). Used from the event loop only."""

    def __init__(self, path):
        self.path = path
        self._identity = None
        self._keys = {}
        self.reloads = 0
        self.reload_failures = 0
        if not self.check():
            raise ValueError("--api_keys=%s: %s" % (path, self.last_error))

    def tenant_of(self, key):
        """The tenant of a bearer key, None when the key is unknown."""
        if not key:
            return None
        return self._keys.get(hash_key(key))

    def __len__(self):
        return len(self._keys)

    def check(self):
        """Re-reads the file when it changed; False when it could not be read or parsed."""
        self.last_error = None
        try:
            st = os.stat(self.path)
            identity = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)
            if identity == self._identity:
                return True
            with open(self.path, encoding="utf-8") as f:
                keys = parse(f.read(), self.path)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            self.last_error = str(e)
            if self._identity is not None:
                self.reload_failures += 1
                logging.error("api keys: %s; keeping the %d keys loaded before", e, len(self._keys))
            return False
        if self._identity is not None:
            self.reloads += 1
            logging.info("api keys: reloaded %s: %d keys", self.path, len(keys))
        self._identity = identity
        self._keys = keys
        return True


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m hybridserve_gateway.keys",
                                     description="Lines of the gateway's API keys file (--api_keys).")
    sub = parser.add_subparsers(dest="command", required=True)
    h = sub.add_parser("hash", help="the line of an existing key")
    h.add_argument("--tenant", required=True)
    h.add_argument("key")
    n = sub.add_parser("new", help="a new random key (printed to stderr) and its line (stdout)")
    n.add_argument("--tenant", required=True)
    args = parser.parse_args(argv)
    if not re.fullmatch(r"\S+", args.tenant) or len(args.tenant.encode("utf-8")) > MAX_TENANT_BYTES:
        parser.error("--tenant: one word without spaces, at most %d bytes" % MAX_TENANT_BYTES)
    if args.command == "new":
        key = "hs-" + secrets.token_urlsafe(32)
        print("key: " + key, file=sys.stderr)
    else:
        key = args.key
    print("sha256:%s %s" % (hash_key(key), args.tenant))


if __name__ == "__main__":
    main()
