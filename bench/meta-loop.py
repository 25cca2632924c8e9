#!/usr/bin/env python3
"""The metadata loop of bench/file and bench/fuse-ceiling, one process.

USAGE: meta-loop.py DIR FILES CLK_TCK

Creates FILES empty files in DIR (open O_CREAT + close), drops the page
cache, stats them, lists DIR, deletes them. Prints the four rates
(operations/s: create stat list delete), then the whole machine's busy
CPU per operation in µs for each (/proc/stat, every process and the
kernel included).
"""
import os
import sys
import time

d, n, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(d, exist_ok=True)


def busy():
    f = open("/proc/stat").readline().split()
    return sum(int(f[i]) for i in (1, 2, 3, 6, 7, 8))


rates, cpu = [], []


def timed(fn):
    b, t = busy(), time.perf_counter()
    fn()
    rates.append(n / (time.perf_counter() - t))
    cpu.append((busy() - b) / hz * 1e6 / n)


timed(lambda: [os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)) for i in range(n)])
os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
timed(lambda: [os.stat(f"{d}/f{i}") for i in range(n)])


def listed():
    assert len(os.listdir(d)) == n


timed(listed)
timed(lambda: [os.unlink(f"{d}/f{i}") for i in range(n)])
print(" ".join(f"{x:.0f}" for x in rates), " ".join(f"{x:.2f}" for x in cpu))
