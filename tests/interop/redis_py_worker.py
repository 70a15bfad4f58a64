"""A redis-py client on lock-core's keys, driven by tests/interop.rs.

It takes lock-core's lock key as it is stored in Redis (what
`LockClient::storage_key` returns) and uses redis-py's own `Lock` on it,
unchanged, as a Python service would. It talks to the test in lines on
stdin and stdout.

    redis_py_worker.py probe PORT LOCK_KEY
        One `acquire(blocking=False)`: prints "acquired" (and releases) or
        "busy".
    redis_py_worker.py hold PORT LOCK_KEY
        Takes the lock (waiting up to 10 s), prints "held TOKEN", then
        releases it when a line arrives on stdin and prints "released".
    redis_py_worker.py count PORT LOCK_KEY COUNTER_KEY LOG_KEY COUNT PAUSE_MS NAME
        Prints "ready" once connected and waits for a line on stdin; then
        COUNT times, under the lock: reads COUNTER_KEY, pauses PAUSE_MS,
        writes it back plus one, and appends NAME to the list LOG_KEY (who
        held the lock, in order). Prints "done".

Errors end the process with a traceback and a non-zero status.
"""

import sys
import time

import redis

# Long enough never to expire during a test's critical section (redis-py
# does not renew by itself).
LEASE_SECONDS = 10
# How long an acquisition waits before it fails the worker.
WAIT_SECONDS = 30
# redis-py polls a held lock at this interval (its default is 0.1 s).
POLL_SECONDS = 0.005


def connect(port):
    client = redis.Redis(host="127.0.0.1", port=int(port), socket_timeout=10)
    client.ping()
    return client


def say(line):
    print(line, flush=True)


def probe(port, lock_key):
    lock = connect(port).lock(lock_key, timeout=LEASE_SECONDS)
    if lock.acquire(blocking=False):
        lock.release()
        say("acquired")
    else:
        say("busy")


def hold(port, lock_key):
    client = connect(port)
    lock = client.lock(lock_key, timeout=LEASE_SECONDS, blocking_timeout=10)
    if not lock.acquire():
        sys.exit("the lock was not free within 10 s")
    say("held " + lock.local.token.decode())
    sys.stdin.readline()
    lock.release()
    say("released")


def count(port, lock_key, counter_key, log_key, times, pause_ms, name):
    client = connect(port)
    pause = int(pause_ms) / 1000
    say("ready")
    sys.stdin.readline()
    for _ in range(int(times)):
        lock = client.lock(
            lock_key,
            timeout=LEASE_SECONDS,
            sleep=POLL_SECONDS,
            blocking_timeout=WAIT_SECONDS,
        )
        # Raises LockError when not acquired in time, and LockNotOwnedError
        # on release when the lock was no longer ours: both fail the test.
        with lock:
            value = int(client.get(counter_key) or 0)
            time.sleep(pause)
            client.set(counter_key, value + 1)
            client.rpush(log_key, name)
    say("done")


def main(args):
    modes = {"probe": (probe, 2), "hold": (hold, 2), "count": (count, 7)}
    if not args or args[0] not in modes or len(args) - 1 != modes[args[0]][1]:
        sys.exit(__doc__)
    run, _ = modes[args[0]]
    run(*args[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
