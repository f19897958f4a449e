#!/usr/bin/env python3
"""The machine's own scheduling jitter, to read latency tails against (issue 13, target 4).

Two probes with nothing of ringmq in them: (1) a thread sleeping 2 ms at a time (as the
bench's open-loop pacing does) and how late it wakes; (2) a 16-byte TCP ping-pong on
loopback between two processes at 1,000 round trips a second. On an idle VM whose vCPUs
the host deschedules, (1) shows multi-millisecond late wake-ups that no broker can hide.
Usage: perf/jitter.py [SECONDS] (default 4 per probe)."""
import multiprocessing
import socket
import sys
import time

SECS = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0


def pct(xs):
    xs = sorted(xs)
    q = lambda f: round(xs[min(len(xs) - 1, int(f * len(xs)))])
    return f"p50 {q(.5)} p99 {q(.99)} p99.9 {q(.999)} max {round(xs[-1])}"


def oversleep():
    late = []
    end = time.perf_counter() + SECS
    while time.perf_counter() < end:
        a = time.perf_counter()
        time.sleep(0.002)
        late.append((time.perf_counter() - a - 0.002) * 1e6)
    return late


def echo(srv):
    c, _ = srv.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        d = c.recv(64)
        if not d:
            return
        c.sendall(d)


def ping_pong():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    p = multiprocessing.Process(target=echo, args=(srv,))
    p.start()
    s = socket.create_connection(srv.getsockname())
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtt = []
    t0 = time.perf_counter()
    n = int(SECS * 1000)
    for i in range(n):
        due = t0 + i / 1000.0
        while time.perf_counter() < due:
            time.sleep(max(0.0, due - time.perf_counter() - 0.0002))
        a = time.perf_counter()
        s.sendall(b"x" * 16)
        s.recv(64)
        rtt.append((time.perf_counter() - a) * 1e6)
    s.close()
    p.join()
    return rtt


if __name__ == "__main__":
    print(f"machine jitter: 2 ms sleeps, late by (us): {pct(oversleep())}")
    print(f"machine jitter: loopback TCP ping-pong at 1,000/s, round trip (us): {pct(ping_pong())}")
