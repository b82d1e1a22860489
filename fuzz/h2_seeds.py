#!/usr/bin/env python3
"""Writes the hand-made seeds of the h2_frames fuzz target into fuzz/corpus/h2_frames/.

Each seed is one options byte (see fuzz/h2_frames_fuzzer.cpp) and the frames a client sends after
the connection preface (RFC 9113 §4.1 frame layout, RFC 7541 HPACK with static-table indices).
"""
import os
import struct

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 2, 3, 4, 6, 7, 8, 9)
END_STREAM, END_HEADERS, PADDED, ACK = 0x1, 0x4, 0x8, 0x1


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream) + payload


def hpack_int(value, prefix_bits, first):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def literal(name_index, value):
    """Literal header field without indexing, indexed name (RFC 7541 §6.2.2)."""
    v = value.encode()
    return hpack_int(name_index, 4, 0x00) + hpack_int(len(v), 7, 0x00) + v


def literal_new(name, value):
    n, v = name.encode(), value.encode()
    return b"\x00" + hpack_int(len(n), 7, 0) + n + hpack_int(len(v), 7, 0) + v


GET, POST, PATH_ROOT, SCHEME_HTTP = b"\x82", b"\x83", b"\x84", b"\x86"


def request(method=GET, path=None, authority="api.example", extra=b""):
    block = method + SCHEME_HTTP + (PATH_ROOT if path is None else literal(4, path))
    return block + literal(1, authority) + extra


SETTINGS_EMPTY = frame(SETTINGS, 0, 0)
SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def seeds():
    yield "get", 3, SETTINGS_EMPTY + SETTINGS_ACK + frame(
        HEADERS, END_HEADERS | END_STREAM, 1, request())
    body = b'{"amount":100}'
    post = request(POST, "/payments", extra=literal(28, str(len(body))) +
                   literal_new("idempotency-key", "k-1") + literal(31, "application/json"))
    yield "post", 3, SETTINGS_EMPTY + frame(HEADERS, END_HEADERS, 1, post) + frame(
        DATA, END_STREAM, 1, body)
    yield "post_in_pieces_streamed", 1 | 4, SETTINGS_EMPTY + frame(
        HEADERS, END_HEADERS, 1, request(POST, "/upload")) + frame(DATA, 0, 1, b"x" * 300) + frame(
            DATA, PADDED | END_STREAM, 1, b"\x04" + b"y" * 10 + b"\0" * 4)
    yield "three_streams_one_reset", 2 | 4, SETTINGS_EMPTY + b"".join(
        frame(HEADERS, END_HEADERS | END_STREAM, i, request(path="/s%d" % i)) for i in (1, 3, 5)
    ) + frame(RST_STREAM, 0, 3, struct.pack(">I", 8))
    yield "pings_settings_windows", 3, SETTINGS_EMPTY + b"".join(
        frame(PING, 0, 0, b"12345678") for _ in range(5)) + frame(
            SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 20)) + frame(
                WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) + frame(
                    PRIORITY, 0, 1, struct.pack(">IB", 0, 16))
    block = request(extra=literal_new("x-long", "v" * 40))
    yield "continuation", 2, SETTINGS_EMPTY + frame(HEADERS, END_STREAM, 1, block[:10]) + frame(
        CONTINUATION, 0, 1, block[10:20]) + frame(CONTINUATION, END_HEADERS, 1, block[20:])
    yield "stalled_body", 3 | 16, SETTINGS_EMPTY + frame(
        HEADERS, END_HEADERS, 1, request(POST, "/slow", extra=literal(28, "1000"))) + frame(
            DATA, 0, 1, b"z" * 100) + frame(HEADERS, END_HEADERS | END_STREAM, 3, request())
    yield "header_list_too_large", 3, SETTINGS_EMPTY + frame(
        HEADERS, END_HEADERS | END_STREAM, 1, request(extra=literal_new("x-big", "b" * 600)))
    yield "body_too_large", 2, SETTINGS_EMPTY + frame(
        HEADERS, END_HEADERS, 1, request(POST, "/big")) + b"".join(
            frame(DATA, 0, 1, b"q" * 1000) for _ in range(3))
    yield "rapid_reset", 3 | 8, SETTINGS_EMPTY + b"".join(
        frame(HEADERS, END_HEADERS | END_STREAM, i, request()) +
        frame(RST_STREAM, 0, i, struct.pack(">I", 8)) for i in range(1, 80, 2))
    yield "head_and_cookies", 3 | 4, SETTINGS_EMPTY + frame(
        HEADERS, END_HEADERS | END_STREAM, 1,
        b"\x42\x04HEAD" + SCHEME_HTTP + PATH_ROOT + literal(1, "a.example") +
        literal(32, "a=1") + literal(32, "b=2"))
    yield "streamed_upload", 2 | 32, SETTINGS_EMPTY + frame(
        HEADERS, END_HEADERS, 1, request(POST, "/upload")) + b"".join(
            frame(DATA, 0, 1, b"u" * 4000) for _ in range(6)) + frame(DATA, END_STREAM, 1, b"end")
    yield "streamed_upload_reset", 3 | 32 | 8, SETTINGS_EMPTY + frame(
        HEADERS, END_HEADERS, 1, request(POST, "/upload", extra=literal(28, "100000"))) + frame(
            DATA, 0, 1, b"v" * 5000) + frame(RST_STREAM, 0, 1, struct.pack(">I", 8))
    yield "goaway", 3, SETTINGS_EMPTY + frame(HEADERS, END_HEADERS | END_STREAM, 1, request()) + frame(
        GOAWAY, 0, 0, struct.pack(">II", 1, 0))


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "h2_frames")
    os.makedirs(out, exist_ok=True)
    for name, options, frames in seeds():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([options]) + frames)


if __name__ == "__main__":
    main()
