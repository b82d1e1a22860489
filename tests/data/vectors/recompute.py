#!/usr/bin/env python3
"""Recomputes every known-answer vector in this directory from the framing README.md describes,
with Python's hashlib and hmac only (no idemgate code), and compares. Read-only: it never writes a
vector file. Exit status 0 when every vector agrees, 1 otherwise.

    python3 tests/data/vectors/recompute.py [DIR]

A second implementation of each format: a change that makes the product and the vector files
agree again (by regenerating the files) still fails here unless this reference changes too.
"""

import hashlib
import hmac
import json
import pathlib
import sys

HERE = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent)
failures = []
checked = 0


def check(file, name, what, got, expected):
    global checked
    checked += 1
    if got != expected:
        failures.append(f"{file}: {name}: {what}: recomputed {got!r}, file has {expected!r}")


def as_bytes(v):
    """A vector's byte string: a JSON string is its UTF-8, {"hex": ...} the bytes it spells."""
    if isinstance(v, str):
        return v.encode("utf-8")
    return bytes.fromhex(v["hex"])


def field(b):
    """Sha256Builder::field: an 8-byte big-endian length, then the bytes."""
    return len(b).to_bytes(8, "big") + b


def header_values(headers):
    """Per configured header, in config order: field(decimal count of values), field(value)..."""
    out = b""
    for h in headers:
        out += field(str(len(h["values"])).encode("ascii"))
        for v in h["values"]:
            out += field(as_bytes(v))
    return out


def sha256(b):
    return hashlib.sha256(b).digest()


# ------------------------------------------------------------------------------------------
# Canonical JSON (fingerprint_body: json): a second implementation on Python's json module.

class NotJson(Exception):
    pass


def _reject_constant(name):
    raise NotJson(name)  # NaN, Infinity, -Infinity: Python accepts them, JSON does not


def _number(text):
    return ("number", text)  # kept as received


def _pairs(pairs):
    return ("object", pairs)  # repeated names kept, in received order


def _escape(s):
    out = '"'
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out += '\\"'
        elif ch == "\\":
            out += "\\\\"
        elif ch in "\b\f\n\r\t":
            out += {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch]
        elif o < 0x20:
            out += "\\u%04x" % o
        else:
            out += ch
    return out + '"'


def _depth(v):
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, tuple) and v[0] == "object":
        return 1 + max((_depth(x) for _, x in v[1]), default=0)
    return 0


def _write(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, str):
        return _escape(v)
    if isinstance(v, list):
        return "[" + ",".join(_write(x) for x in v) + "]"
    kind, payload = v
    if kind == "number":
        return payload
    members = sorted(payload, key=lambda kv: kv[0].encode("utf-8"))  # stable: repeats keep order
    return "{" + ",".join(_escape(k) + ":" + _write(x) for k, x in members) + "}"


def canonical_json(body):
    """The canonical text of `body`, or None when it is not one JSON document of depth <= 32."""
    try:
        text = body.decode("utf-8")
        value = json.loads(text, parse_int=_number, parse_float=_number,
                           parse_constant=_reject_constant, object_pairs_hook=_pairs)
        if _depth(value) > 32:
            return None
        out = _write(value)
        out.encode("utf-8")  # a lone surrogate escape is not UTF-8: not JSON for Boost.JSON
        return out
    except (ValueError, NotJson, UnicodeError, RecursionError):
        return None


# ------------------------------------------------------------------------------------------

def load(name):
    with open(HERE / name, encoding="utf-8") as f:
        return json.load(f)["vectors"]


def scope_of(route, headers):
    return sha256(field(b"idemgate-scope-v1") + field(route.encode()) + header_values(headers))


def record_id_of(scope, key):
    return sha256(field(b"idemgate-record-v1") + field(scope) + field(key))


def crc16_xmodem(data):
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def slot_of(key):
    open_ = key.find(b"{")
    if open_ >= 0:
        close = key.find(b"}", open_ + 1)
        if close > open_ + 1:
            key = key[open_ + 1:close]
    return crc16_xmodem(key) % 16384


def u16(n):
    return n.to_bytes(2, "big")


def u32(n):
    return n.to_bytes(4, "big")


def header_blob(fields):
    out = b"\x01"
    for name, value in fields:
        out += u32(len(as_bytes(name))) + as_bytes(name) + u32(len(as_bytes(value))) + as_bytes(value)
    return out


def marker(fingerprint, response):
    out = b"IGM1" + fingerprint
    if response is None:
        return out + b"\x00"
    out += bytes([1 | (2 if response["body_omitted"] else 0)])
    out += u16(response["status"]) + u32(len(response["headers"]))
    for name, value in response["headers"]:
        out += u32(len(as_bytes(name))) + as_bytes(name) + u32(len(as_bytes(value))) + as_bytes(value)
    body = as_bytes(response["body"])
    return out + u32(len(body)) + body


def sf_key(value):
    """An Idempotency-Key field value of a valid key: a bare token or an sf-string, unquoted."""
    v = value.strip(" \t")
    if not v.startswith('"'):
        return v
    out, i = "", 1
    while v[i] != '"':
        if v[i] == "\\":
            i += 1
        out += v[i]
        i += 1
    return out


def pointer_key(body, pointer):
    value = json.loads(body)
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        value = value[int(token)] if isinstance(value, list) else value[token]
    if isinstance(value, str):
        return "s:" + value
    assert isinstance(value, int) and not isinstance(value, bool)
    return "i:" + str(value)


def main():
    for v in load("fingerprint.json"):
        f = "fingerprint.json"
        body = as_bytes(v["body"])
        data = field(b"idemgate-fingerprint-v1") + field(v["method"].encode()) + \
            field(v["target"].encode()) + header_values(v["headers"])
        canonical = canonical_json(body) if v["mode"] == "json" else None
        if v["mode"] == "json":
            check(f, v["name"], "canonical", canonical, v["canonical"])
        if canonical is not None:
            data += field(b"json") + field(canonical.encode("utf-8"))
        else:
            data += field(b"bytes") + field(body)
        check(f, v["name"], "fingerprint", sha256(data).hex(), v["fingerprint"])

    for v in load("canonical_json.json"):
        check("canonical_json.json", v["name"], "canonical", canonical_json(as_bytes(v["input"])),
              v["canonical"])

    for v in load("scope.json"):
        check("scope.json", v["name"], "scope", scope_of(v["route"], v["headers"]).hex(), v["scope"])

    for v in load("record_id.json"):
        scope = scope_of(v["route"], v["headers"])
        check("record_id.json", v["name"], "scope", scope.hex(), v["scope"])
        check("record_id.json", v["name"], "record_id",
              record_id_of(scope, as_bytes(v["key"])).hex(), v["record_id"])

    for v in load("key_source.json"):
        if v["source"] == "header":
            key = sf_key(v["values"][0])
        elif v["source"] == "headers":
            parts = [sf_key(p[0]) for p in v["parts"]]
            key = "".join(f"{len(p.encode())}:{p}" for p in parts)
        else:
            key = pointer_key(v["body"], v["pointer"])
        check("key_source.json", v["name"], "key", key, v["key"])

    for v in load("store_keys.json"):
        if "from" in v:
            src = v["from"]
            rid = record_id_of(scope_of(src["route"], src["headers"]), as_bytes(src["key"]))
            check("store_keys.json", v["name"], "record_id", rid.hex(), v["record_id"])
        key = "idemgate:lock:" + v["record_id"]
        check("store_keys.json", v["name"], "redis_lock_key", key, v["redis_lock_key"])
        check("store_keys.json", v["name"], "redis_slot", slot_of(key.encode()), v["redis_slot"])

    for v in load("redis_slot.json"):
        check("redis_slot.json", v["name"], "slot", slot_of(as_bytes(v["key"])), v["slot"])
    check("redis_slot.json", "CRC16/XMODEM check value", "crc16", crc16_xmodem(b"123456789"), 0x31C3)

    for v in load("pg_headers.json"):
        check("pg_headers.json", v["name"], "blob", header_blob(v["headers"]).hex(), v["blob"])

    for v in load("replay_marker.json"):
        check("replay_marker.json", v["name"], "encoding",
              marker(bytes.fromhex(v["fingerprint"]), v["response"]).hex(), v["encoding"])

    for v in load("upstream_key_rewrite.json"):
        scope = scope_of(v["route"], v["headers"])
        check("upstream_key_rewrite.json", v["name"], "scope", scope.hex(), v["scope"])
        material = sha256(field(scope.hex().encode("ascii")) + field(as_bytes(v["key"])))
        value = hmac.new(as_bytes(v["secret"]), material, hashlib.sha256).hexdigest()
        check("upstream_key_rewrite.json", v["name"], "value", value, v["value"])

    for v in load("hmac_sha256_rfc4231.json"):
        mac = hmac.new(as_bytes(v["key"]), as_bytes(v["data"]), hashlib.sha256).hexdigest()
        bits = v.get("truncated_to_bits", 256)
        check("hmac_sha256_rfc4231.json", v["name"], "hmac", mac[:bits // 4], v["hmac_sha256"])

    for line in failures:
        print(line)
    print(f"{checked} values recomputed, {len(failures)} differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
