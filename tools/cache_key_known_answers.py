#!/usr/bin/env python3
"""Known answers for the cache keys, from proto/cachestore.proto's text alone.

Recomputes the namespace, page and state keys (key version 3) with Python's xxhash (XXH3-128),
independently of cachestore/keys.cc, and prints them as Hash128::ToHex() writes
them (32 hex digits, high 64 bits then low). cachestore/keys_test.cc hard-codes
this output; re-run after a deliberate change of the key derivation:

  pip install xxhash && python3 tools/cache_key_known_answers.py
"""

import struct

import xxhash


def h(data: bytes) -> bytes:
    """XXH3-128 as the wire's 16 bytes: the 128-bit value, little-endian."""
    return xxhash.xxh3_128_intdigest(data).to_bytes(16, "little")


def hex_of(key: bytes) -> str:
    return "%032x" % int.from_bytes(key, "little")


def length_prefixed(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def namespace_key(fingerprint: str, adapter: str, tenant: str, salt: str, page_size: int) -> bytes:
    return h(length_prefixed("hybridserve/ns/v3") + length_prefixed(fingerprint) + length_prefixed(adapter) +
             length_prefixed(tenant) + length_prefixed(salt) + struct.pack("<i", page_size))


def tokens_le(tokens) -> bytes:
    return b"".join(struct.pack("<i", t) for t in tokens)


def page_keys(ns: bytes, tokens, page_size: int):
    keys, prev = [], ns
    for i in range(len(tokens) // page_size):
        content = h(tokens_le(tokens[i * page_size:(i + 1) * page_size]))  # C_i
        prev = h(prev + content)  # K_i = H(K_{i-1} || C_i)
        keys.append(prev)
    return keys


def state_key(ns: bytes, tokens, page_size: int, p: int) -> bytes:
    n = p // page_size
    parent = ns if n == 0 else page_keys(ns, tokens, page_size)[n - 1]
    return h(h(parent + b"hybridserve/state/v2") + tokens_le(tokens[n * page_size:p]))


def main():
    print("namespace fp/lora/org_1/2345/16  ", hex_of(namespace_key("fp", "lora", "org_1", "2345", 16)))
    print("namespace fp/lora/org_12345//16  ", hex_of(namespace_key("fp", "lora", "org_12345", "", 16)))
    print("namespace model-a////0x01020304  ", hex_of(namespace_key("model-a", "", "", "", 0x01020304)))
    ns = namespace_key("fp", "", "", "", 4)
    print("namespace fp////4                ", hex_of(ns))
    # Token ids with distinct bytes expose the byte order.
    tokens = [1, 2, 3, 4, 0x01020304, 2**31 - 1, 0, 7, 9, 10]
    for i, k in enumerate(page_keys(ns, tokens, 4)):
        print("page %d                        " % i, hex_of(k))
    for p in (0, 3, 4, 8, 10):
        print("state at %-2d                   " % p, hex_of(state_key(ns, tokens, 4, p)))
    print("wire bytes of page 0          ", page_keys(ns, tokens, 4)[0].hex())


if __name__ == "__main__":
    main()
