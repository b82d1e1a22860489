#!/usr/bin/env python3
"""Load generator and checker of scripts/soak (standard library only).

  soak.py load  --state FILE --seconds N --gateway URL --stats URL --metrics URL --pid PID
  soak.py check --state FILE --gateway URL --metrics URL --pg-dsn DSN --payments-dsn DSN \
                --service-log FILE

`load` drives a mixed load through the gateway for N seconds and prints a line every 10 s;
it saves what every key was answered (and the samples) in FILE. `check` runs once the stores
are back: it settles the keys whose outcome stayed uncertain, replays every key that got a 2xx,
looks each record up in Postgres, compares upstream executions with distinct keys and the
RSS / descriptor trend, prints the summary and exits 1 on any failure.

Request mix (per worker, one at a time, with a short pause): pass-through GETs of created
payments, new keys, replays of keys already answered 2xx, retries of keys whose answer was
uncertain (5xx, 409 of a held lock, a lost connection); a separate thread sends storms of
concurrent identical requests with one fresh key.
"""

import argparse
import hashlib
import http.client
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import threading
import time
import urllib.parse

ROUTE = "payments"  # the keyed route of conf/demo.yaml
AUTH = "Bearer soak"  # its key_scope header: one client
WORKERS = 6
STORM_SIZE = 20
STORM_EVERY = 3.0  # seconds between storms
SAMPLE_EVERY = 10.0
RSS_GROWTH = 0.10  # last third's median RSS above the middle third's by more than this fails
FD_GROWTH = 20  # descriptors, same comparison

# Answers after which a key may have run at the upstream without a stored answer: its 5xx (not
# stored, C21), the gateway's 502/504 (C22) and a lost connection. The gateway's own
# store-unavailable 503 is not one: the request was not forwarded (C25).
UNCERTAIN = {"5xx", "error"}
STORE_PROBLEM = b"idemgate.dev/problems/store-unavailable"


def host_port(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port


def field(b):
    return struct.pack(">Q", len(b)) + b


def record_id(key):
    """gateway/core/fingerprint.cpp: record_id(compute_scope(route, [Authorization]), key)."""
    scope = hashlib.sha256(
        field(b"idemgate-scope-v1") + field(ROUTE.encode()) + field(b"1") + field(AUTH.encode())
    ).digest()
    return hashlib.sha256(field(b"idemgate-record-v1") + field(scope) + field(key.encode())).hexdigest()


def payment_body(key):
    return json.dumps(
        {"order_id": key, "customer_id": "c-soak", "provider": "soak",
         "external_payment_id": key, "amount": "10.00"},
        separators=(",", ":")).encode()


class Client:
    """One keep-alive connection, opened on demand; closed after any failure. A failed request
    is not resent here: the load notes it as an uncertain answer and retries the key later, as a
    client would."""

    def __init__(self, url, timeout=30):
        self.host, self.port = host_port(url)
        self.timeout = timeout
        self.conn = None

    def connect(self):
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.conn.connect()
        except OSError:
            self.close()

    def request(self, method, path, body=None, headers=None):
        """(status, headers dict lower-case, body bytes) or None when the connection failed."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.conn.request(method, path, body=body, headers=headers or {})
            r = self.conn.getresponse()
            data = r.read()
            hdrs = {k.lower(): v for k, v in r.getheaders()}
            if r.will_close:
                self.close()
            return r.status, hdrs, data
        except (OSError, http.client.HTTPException):
            self.close()
            return None

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = None


def keyed_post(client, key):
    return client.request("POST", "/payments", payment_body(key), {
        "Idempotency-Key": key, "Content-Type": "application/json", "Authorization": AUTH})


def classify(answer):
    if answer is None:
        return "error"
    s = answer[0]
    if 200 <= s < 300:
        return "2xx"
    if s in (409, 422):
        return str(s)
    if s == 503 and STORE_PROBLEM in answer[2]:
        return "503store"
    if s >= 500:
        return "5xx"
    return "other"


def proc_sample(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def get_json(url):
    try:
        h, p = host_port(url)
        c = http.client.HTTPConnection(h, p, timeout=5)
        c.request("GET", urllib.parse.urlsplit(url).path)
        r = c.getresponse()
        data = r.read()
        c.close()
        return json.loads(data) if r.status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None


def metrics(url):
    """The counters of /metrics that the soak reports: requests by outcome, duplicates, commit
    failures."""
    out = {"outcomes": {}, "duplicates": None, "commit_failures": None}
    try:
        h, p = host_port(url)
        c = http.client.HTTPConnection(h, p, timeout=5)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
    except (OSError, http.client.HTTPException):
        return out
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith("idemgate_requests_total{"):
            outcome = name.split('outcome="', 1)[1].split('"', 1)[0]
            out["outcomes"][outcome] = out["outcomes"].get(outcome, 0) + int(float(value))
        elif name == "idemgate_duplicate_executions_total":
            out["duplicates"] = int(float(value))
        elif name == "idemgate_record_commit_failures_total":
            out["commit_failures"] = int(float(value))
    return out


class Ledger:
    """What the clients saw, per key. A key's first 2xx answer is the one every later 2xx must
    equal (status and body)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.keys = {}  # key → {"first": [status, body] | None, "uncertain": n, "answers": n}
        self.answered = []  # keys with a 2xx, in order (replay candidates)
        self.pending = []  # keys whose outcome is uncertain (retry candidates)
        self.locations = []  # payment URLs from 201s (pass-through candidates)
        self.counts = {}  # "kind:class" → n
        self.violations = []

    def count(self, kind, cls):
        with self.lock:
            self.counts[f"{kind}:{cls}"] = self.counts.get(f"{kind}:{cls}", 0) + 1

    def violation(self, text):
        with self.lock:
            if len(self.violations) < 1000:
                self.violations.append(text)

    def note(self, kind, key, answer):
        """Records a keyed answer and checks it against the key's first 2xx."""
        cls = classify(answer)
        self.count(kind, cls)
        with self.lock:
            k = self.keys.setdefault(key, {"first": None, "uncertain": 0, "answers": 0})
            k["answers"] += 1
            if cls == "2xx":
                status, hdrs, body = answer
                if k["first"] is None:
                    k["first"] = [status, body.decode("latin-1")]
                    self.answered.append(key)
                    if key in self.pending:
                        self.pending.remove(key)
                    if status == 201 and "location" in hdrs:
                        self.locations.append(hdrs["location"])
                elif k["first"] != [status, body.decode("latin-1")]:
                    self.violations.append(
                        f"{kind} {key}: {status} differs from the first answer {k['first'][0]}"
                        f" (or its body)")
                if kind == "replay" and hdrs.get("idempotent-replayed") != "true":
                    self.violations.append(f"replay {key}: {status} without Idempotent-Replayed")
            elif cls in UNCERTAIN or cls in ("409", "503store"):
                # No answer to keep yet: the key is retried later (a 409 is a storm's or a held
                # lock's).
                k["uncertain"] += cls in UNCERTAIN
                if k["first"] is None and key not in self.pending:
                    self.pending.append(key)
            elif cls in ("422", "other"):
                self.violations.append(f"{kind} {key}: unexpected {answer[0]} "
                                       f"{answer[2][:200].decode('latin-1')}")
        return cls

    def pick(self, which):
        with self.lock:
            items = getattr(self, which)
            return random.choice(items) if items else None


def worker(args, ledger, stop, prefix):
    client = Client(args.gateway)
    n = 0
    while not stop.is_set():
        r = random.random()
        if r < 0.25:
            loc = ledger.pick("locations")
            path = loc if loc else "/healthz"
            answer = client.request("GET", path)
            cls = classify(answer)
            ledger.count("pass", cls)
            if answer is not None and answer[0] == 404:
                ledger.violation(f"pass {path}: 404 for a payment answered 201")
        elif r < 0.60:
            n += 1
            key = f"{prefix}-{n}"
            ledger.note("new", key, keyed_post(client, key))
        elif r < 0.90:
            key = ledger.pick("answered")
            if key:
                ledger.note("replay", key, keyed_post(client, key))
        else:
            key = ledger.pick("pending")
            if key:
                ledger.note("retry", key, keyed_post(client, key))
        time.sleep(random.uniform(0.01, 0.04))
    client.close()


def storms(args, ledger, stop, prefix):
    n = 0
    while not stop.wait(STORM_EVERY):
        n += 1
        key = f"{prefix}-storm-{n}"
        barrier = threading.Barrier(STORM_SIZE)

        def one():
            client = Client(args.gateway)
            client.connect()
            try:
                barrier.wait(5)
            except threading.BrokenBarrierError:
                pass
            ledger.note("storm", key, keyed_post(client, key))
            client.close()

        threads = [threading.Thread(target=one) for _ in range(STORM_SIZE)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with ledger.lock:
            k = ledger.keys.get(key)
            executed = k is not None and k["first"] is not None
        if executed:
            ledger.count("storm", "keys_2xx")


def status_line(elapsed, sample, ledger, stats, m):
    with ledger.lock:
        by = {}
        for kc, v in ledger.counts.items():
            cls = kc.split(":", 1)[1]
            if cls != "keys_2xx":
                by[cls] = by.get(cls, 0) + v
        keys2xx = len(ledger.answered)
        total = sum(by.values())
    outcome = " ".join(f"{c}={by[c]}" for c in sorted(by))
    posts = stats.get("payment_posts", "?") if stats else "?"
    inserted = stats.get("payments_inserted", "?") if stats else "?"
    dup = m["duplicates"] if m["duplicates"] is not None else "?"
    return (f"t={elapsed:4.0f}s rss_kb={sample[0]} fds={sample[1]} requests={total} ({outcome}) "
            f"keys_2xx={keys2xx} upstream_posts={posts} inserted={inserted} duplicates={dup}")


def cmd_load(args):
    ledger = Ledger()
    stop = threading.Event()
    prefix = f"soak-{int(time.time())}-{os.getpid()}"
    threads = [threading.Thread(target=worker, args=(args, ledger, stop, f"{prefix}-w{i}"))
               for i in range(WORKERS)]
    threads.append(threading.Thread(target=storms, args=(args, ledger, stop, prefix)))
    for t in threads:
        t.start()
    samples = []
    start = time.monotonic()
    next_sample = start + SAMPLE_EVERY
    try:
        while True:
            now = time.monotonic()
            if now >= start + args.seconds:
                break
            time.sleep(max(0.0, min(next_sample, start + args.seconds) - now))
            if time.monotonic() >= next_sample:
                next_sample += SAMPLE_EVERY
                sample = proc_sample(args.pid)
                samples.append(sample)
                line = status_line(time.monotonic() - start, sample, ledger,
                                   get_json(args.stats), metrics(args.metrics))
                print(line, flush=True)
    finally:
        stop.set()
        for t in threads:
            t.join()
    with ledger.lock:
        state = {"keys": ledger.keys, "answered": ledger.answered, "pending": ledger.pending,
                 "counts": ledger.counts, "violations": ledger.violations, "samples": samples,
                 "seconds": time.monotonic() - start, "pid": args.pid}
    with open(args.state, "w") as f:
        json.dump(state, f)
    return 0


def psql(dsn, sql):
    out = subprocess.run(["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", dsn, "-c", sql],
                         check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line]


def service_posts(path):
    """POST /payments answers of the payment service, by status, from its JSON log."""
    by = {}
    with open(path, errors="replace") as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("msg") == "request" and e.get("method") == "POST" and e.get("target") == "/payments":
                by[e["status"]] = by.get(e["status"], 0) + 1
    return by


def trend(samples):
    """(ok, text): the last third's medians against the middle third's (the first is warm-up)."""
    n = len(samples) // 3
    if n < 2:
        return True, f"too few samples ({len(samples)}) for a trend; not judged"
    mid, last = samples[n:2 * n], samples[2 * n:]
    rss_mid = statistics.median(s[0] for s in mid)
    rss_last = statistics.median(s[0] for s in last)
    fd_mid = statistics.median(s[1] for s in mid)
    fd_last = statistics.median(s[1] for s in last)
    xs = list(range(len(samples) - n))
    ys = [s[0] for s in samples[n:]]
    slope = statistics.linear_regression(xs, ys).slope if len(set(ys)) > 1 else 0.0
    ok = rss_last <= rss_mid * (1 + RSS_GROWTH) and fd_last <= fd_mid + FD_GROWTH
    text = (f"RSS median middle/last third {rss_mid:.0f}/{rss_last:.0f} kB "
            f"(limit +{RSS_GROWTH:.0%}, slope after warm-up {slope * 6:+.0f} kB/min); "
            f"fds median {fd_mid:.0f}/{fd_last:.0f} (limit +{FD_GROWTH})")
    return ok, text


def cmd_check(args):
    with open(args.state) as f:
        state = json.load(f)
    keys = state["keys"]
    ledger = Ledger()
    ledger.keys = keys
    ledger.answered = state["answered"]
    ledger.violations = state["violations"]
    client = Client(args.gateway)
    failures = []

    # Keys still uncertain: retry until they get a definite answer (a held lock answers 409
    # until lock_ttl; a 5xx left nothing behind).
    pending = list(state["pending"])
    deadline = time.monotonic() + args.settle_seconds
    while pending and time.monotonic() < deadline:
        still = []
        for key in pending:
            if ledger.note("settle", key, keyed_post(client, key)) != "2xx":
                still.append(key)
        pending = still
        if pending:
            time.sleep(1)
    if pending:
        failures.append(f"{len(pending)} keys never got a 2xx within {args.settle_seconds}s "
                        f"after the chaos stopped (e.g. {pending[0]})")

    # (a) every key answered 2xx replays the same answer and has its record in Postgres.
    answered = [k for k, v in keys.items() if v["first"] is not None]
    # The records first: a replay that finds none executes again and writes a new one.
    records = set(psql(args.pg_dsn, "SELECT encode(id, 'hex') FROM idempotency_record"))
    replay_bad = 0
    for key in answered:
        answer = keyed_post(client, key)
        first = keys[key]["first"]
        if (answer is None or [answer[0], answer[2].decode("latin-1")] != first
                or answer[1].get("idempotent-replayed") != "true"):
            replay_bad += 1
            if replay_bad <= 5:
                got = "no answer" if answer is None else f"{answer[0]} replayed=" \
                    f"{answer[1].get('idempotent-replayed')}"
                failures.append(f"final replay of {key}: {got}, first answer was {first[0]}")
    if replay_bad:
        failures.append(f"{replay_bad} of {len(answered)} final replays differ")
    lost = [k for k in answered if record_id(k) not in records]
    if lost:
        failures.append(f"{len(lost)} keys answered 2xx have no record in Postgres "
                        f"(lost records, e.g. {lost[0]})")

    # (b) upstream executions against distinct keys. The payment service's UNIQUE
    # (provider, external_payment_id) absorbs a second execution: its answer is then 200 (the
    # existing row) instead of 201, so its 200s are the double executions. A second execution is
    # the contract (C21/C22) only after an uncertain answer: the upstream's 5xx, an unknown
    # outcome, a lost connection — so the key's final answer is a 200 and the key was uncertain.
    rows = set(psql(args.payments_dsn,
                    "SELECT external_payment_id FROM payment WHERE provider = 'soak'"))
    posts = service_posts(args.service_log)
    inserted, existing = posts.get(201, 0), posts.get(200, 0)
    explained = sum(keys[k]["uncertain"] for k in answered if keys[k]["first"][0] == 200)
    unexplained_200 = [k for k in answered if keys[k]["first"][0] == 200 and not keys[k]["uncertain"]]
    orphans = rows - set(answered)
    missing = [k for k in answered if k not in rows]
    m = metrics(args.metrics)
    # A Redis restart loses the locks of requests in flight: a retry may then execute again,
    # the upstream's UNIQUE absorbs it and the gateway's insert finds the first record, so the
    # client gets that one and idemgate_duplicate_executions_total rises (SPEC C36: Postgres is
    # the arbiter, the lock only makes this rare). Reported, not a failure; a second execution
    # that neither an uncertain answer nor a lost lock accounts for is one.
    lost_locks = m["duplicates"] or 0
    if existing > explained + lost_locks:
        failures.append(f"double executions: the upstream met an existing row {existing} times, "
                        f"{explained} of them after an uncertain answer and {lost_locks} after "
                        f"a lost lock (C36)")
    if unexplained_200:
        failures.append(f"{len(unexplained_200)} keys were answered 200 (second execution) with "
                        f"no uncertain answer before (e.g. {unexplained_200[0]})")
    if orphans:
        failures.append(f"{len(orphans)} payments executed whose key never got a 2xx "
                        f"(e.g. {sorted(orphans)[0]})")
    if missing:
        failures.append(f"{len(missing)} keys answered 2xx have no payment row (e.g. {missing[0]})")

    # (c) growth of RSS and descriptors.
    samples = state["samples"]
    trend_ok, trend_text = trend(samples)
    if not trend_ok:
        failures.append("growth: " + trend_text)

    violations = ledger.violations
    if violations:
        failures.append(f"{len(violations)} answers broke the contract during the load, first: "
                        f"{violations[0]}")

    counts = {}
    for kc, v in ledger.counts.items():
        counts[kc] = counts.get(kc, 0) + v
    for kc, v in state["counts"].items():
        counts[kc] = counts.get(kc, 0) + v
    kinds = {}
    for kc, v in counts.items():
        kind, cls = kc.split(":", 1)
        kinds.setdefault(kind, {})[cls] = v
    print()
    print("=== soak summary ===")
    print(f"duration           {state['seconds']:.0f} s, {len(samples)} samples")
    for kind in ("pass", "new", "replay", "storm", "retry", "settle"):
        if kind in kinds:
            print(f"{kind:<18} " + " ".join(f"{c}={kinds[kind][c]}" for c in sorted(kinds[kind])))
    print(f"gateway outcomes   " + " ".join(f"{o}={n}" for o, n in sorted(m["outcomes"].items())))
    print(f"keys answered 2xx  {len(answered)} (of {len(keys)} sent; {sum(1 for v in keys.values() if v['uncertain'])} had an uncertain answer first)")
    print(f"final replays      {len(answered) - replay_bad}/{len(answered)} identical")
    print(f"records in PG      {len(answered) - len(lost)}/{len(answered)} found ({len(records)} rows in all)")
    print(f"upstream POSTs     " + " ".join(f"{s}={n}" for s, n in sorted(posts.items())))
    print(f"payment rows       {len(rows)} (distinct keys executed; {inserted} answered 201)")
    print(f"double executions  {existing} (upstream answered 200: existing row; after an uncertain "
          f"answer: {explained}, after a lost lock: {lost_locks}; every one absorbed by the "
          f"upstream's UNIQUE)")
    print(f"duplicate counter  {m['duplicates']}; record commit failures {m['commit_failures']}")
    print(f"first/last sample  rss_kb {samples[0][0] if samples else '?'} → {samples[-1][0] if samples else '?'}, "
          f"fds {samples[0][1] if samples else '?'} → {samples[-1][1] if samples else '?'}")
    print(f"trend              {trend_text}")
    if failures:
        print("RESULT: FAIL")
        for f_ in failures:
            print(f"  - {f_}")
        return 1
    print("RESULT: PASS")
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["load", "check"])
    p.add_argument("--state", required=True)
    p.add_argument("--gateway", required=True)
    p.add_argument("--metrics", required=True)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--stats")
    p.add_argument("--pid", type=int)
    p.add_argument("--pg-dsn")
    p.add_argument("--payments-dsn")
    p.add_argument("--service-log")
    p.add_argument("--settle-seconds", type=float, default=90)
    args = p.parse_args()
    return cmd_load(args) if args.command == "load" else cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
