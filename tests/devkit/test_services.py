"""The throwaway Redis of the several-replica tests (scripts/start_redis.sh):
loopback only, no persistence, gone after stop."""

import os
import shutil

import pytest

from devkit.services import ThrowawayRedis, replica_env

pytestmark = pytest.mark.skipif(
    not shutil.which("redis-server") and os.geteuid() != 0,
    reason="redis-server is not installed and this user cannot install it (scripts/start_redis.sh needs root)",
)


def test_throwaway_redis_answers_on_loopback_without_persistence():
    redis = ThrowawayRedis().start()
    try:
        assert redis.url.startswith("redis://127.0.0.1:")
        assert redis.command("PING") == ["+PONG"]
        assert redis.command("SET", "acc-key", "value") == ["+OK"]
        assert redis.command("GET", "acc-key") == ["$5", "value"]
        assert redis.command("CONFIG", "GET", "save")[-1] == ""  # no RDB snapshots
        assert redis.command("CONFIG", "GET", "appendonly")[-1] == "no"
        assert redis.command("CONFIG", "GET", "bind")[-1] == "127.0.0.1"
        directory = redis.dir
        assert os.path.isdir(directory)
    finally:
        redis.stop()
    assert not os.path.exists(directory)


def test_replica_env_names_the_shared_services():
    env = replica_env("postgresql://u@127.0.0.1:5/owui", "redis://127.0.0.1:6/0", schema="owui")
    assert env["WEBSOCKET_MANAGER"] == "redis"
    assert env["REDIS_URL"] == env["WEBSOCKET_REDIS_URL"] == "redis://127.0.0.1:6/0"
    assert env["DATABASE_SCHEMA"] == "owui" and env["DATABASE_URL"].endswith("/owui")
    assert env["ENABLE_WEBSOCKET_SUPPORT"] == "true"
