"""redis-py against a running `lightstore node` (port in argv[1]).

Runs the same checks over RESP3 (redis-py's default HELLO 3) and RESP2, with
binary values and a 16 MiB value; exits non-zero on the first failure.
"""
import sys

import redis


def check(r, tag):
    p = f"{tag}:"
    assert r.ping() is True
    assert r.set(p + "hello", "world") is True
    assert r.get(p + "hello") == b"world"
    assert r.get(p + "missing") is None
    assert r.set(p + "hello", "x", nx=True) is None
    assert r.mset({p + "a": "1", p + "b": "2", p + "c": "3"}) is True
    assert r.mget([p + "a", p + "nope", p + "c"]) == [b"1", None, b"3"]
    assert r.exists(p + "a", p + "b", p + "nope") == 2
    assert r.delete(p + "a", p + "nope") == 1
    assert r.exists(p + "a") == 0
    assert r.strlen(p + "hello") == 5
    assert r.getrange(p + "hello", -3, -1) == b"rld"

    pipe = r.pipeline(transaction=False)
    for i in range(1000):
        pipe.set(f"{p}pipe:{i:04d}", f"v{i}")
    res = pipe.execute()
    assert res == [True] * 1000, res[:5]
    assert r.get(f"{p}pipe:0999") == b"v999"

    found = sorted(r.scan_iter(match=f"{p}pipe:01*", count=50))
    assert found == [f"{p}pipe:{i:04d}".encode() for i in range(100, 200)], found[:3]

    flat = r.execute_command("RANGE", f"{p}pipe:0010", f"{p}pipe:0013")
    assert flat == [
        f"{p}pipe:0010".encode(), b"v10",
        f"{p}pipe:0011".encode(), b"v11",
        f"{p}pipe:0012".encode(), b"v12",
    ], flat
    limited = r.execute_command("RANGE", f"{p}pipe:", "", "LIMIT", "2")
    assert len(limited) == 4, limited

    info = r.info()
    assert "write_amplification" in info, sorted(info)[:20]
    assert "total_commands_processed" in info
    engine_info = r.info("engine")
    assert float(engine_info["write_amplification"]) > 0

    binary = bytes(range(256)) * 4 + b"\r\n\x00"
    assert r.set(p + "bin\x00\r\n", binary)
    assert r.get(p + "bin\x00\r\n") == binary

    try:
        r.execute_command("EXPIRE", p + "hello", 10)
        raise AssertionError("EXPIRE should be refused")
    except redis.ResponseError as e:
        assert "not supported" in str(e), e
    assert r.get(p + "hello") == b"world"


def main():
    port = int(sys.argv[1])
    r3 = redis.Redis(port=port, protocol=3)
    check(r3, "resp3")
    hello = r3.execute_command("HELLO", "3")
    server = hello.get(b"server", hello.get("server"))
    assert server in (b"lightstore", "lightstore"), hello
    assert hello.get(b"proto", hello.get("proto")) == 3, hello

    r2 = redis.Redis(port=port, protocol=2)
    check(r2, "resp2")

    default = redis.Redis(port=port)
    assert default.set("default:k", "v") and default.get("default:k") == b"v"

    big = bytes((i * 7) % 256 for i in range(1 << 16)) * 256  # 16 MiB
    assert len(big) == 16 << 20
    assert r3.set("big", big)
    assert r3.get("big") == big
    assert r2.strlen("big") == 16 << 20
    print("python client checks passed")


if __name__ == "__main__":
    main()
