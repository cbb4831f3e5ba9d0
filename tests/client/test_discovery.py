"""dns://NAME:PORT host specs: every address of a name becomes a host, min_hosts waits for
replicas, and a lost host is replaced by resolving the name again.

The hosts are real processes bound to distinct loopback addresses (127.0.0.1, 127.0.0.2, ...,
and ::1) on one port, as replicas behind one name are; a fake resolver stands for the DNS server
of Compose or Kubernetes (the cluster test uses the real one)."""

from __future__ import annotations

import re
import socket
import threading

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from helpers import assert_same

from envserver import client
from envserver.client._transport.discovery import Discovery
from envserver.testing import start_host
from envserver.wire.endpoints import HostSpec, resolve_dns, tcp_endpoint

EPISODIC = "envserver/Episodic-v0"
HOSTED = f"envserver.testing:{EPISODIC}"  # hosts import the test envs' module
KWARGS = {"terminate_prob": 0.05, "max_steps": 30}

# The replicas share one port across loopback addresses: a test that binds an ephemeral port on
# another address at the same time could take it (make test runs two workers). The tests that
# bind ::1 or a wildcard address elsewhere carry this group too.
pytestmark = pytest.mark.xdist_group("loopback-port")


class FakeDns:
    """A resolver whose answers the test changes, counting the lookups."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.lookups = 0
        self.looked_up = threading.Event()

    def __call__(self, name: str, port: int) -> list[str]:
        self.lookups += 1
        self.looked_up.set()
        if name != "envhost":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.addresses)


@pytest.fixture
def replicas(tmp_path):
    """Starts hosts on one port, one per loopback address asked for; stops them all at the end."""
    started = []
    port = []

    def start(address: str):
        if not port:
            host = start_host(tmp_path, bind=f"tcp://{address}:*")
            port.append(int(host.endpoint.rsplit(":", 1)[1]))
        else:
            bind = tcp_endpoint(address, port[0])
            host = start_host(tmp_path, bind=bind)
        started.append(host)
        return host

    start.port = port
    yield start
    for host in started:
        host.stop()


def test_every_address_of_a_name_is_a_host_and_results_match_sync_vector_env(replicas):
    hosts = [replicas(a) for a in ("127.0.0.1", "127.0.0.2", "::1")]
    port = replicas.port[0]
    plain = start_host(hosts[0].log.parent, bind="tcp://127.0.0.1:*")
    dns = FakeDns("127.0.0.2", "::1", "127.0.0.1")
    envs = client.make_vec(
        HOSTED,
        num_envs=7,
        hosts=[plain.endpoint, f"dns://envhost:{port}"],
        vector_kwargs={"resolver": dns, "min_hosts": 4},
        **KWARGS,
    )
    oracle = SyncVectorEnv([lambda: gym.make(EPISODIC, **KWARGS)] * 7)
    try:
        assert envs.hosts == (
            plain.endpoint,
            f"tcp://127.0.0.2:{port}",
            f"tcp://[::1]:{port}",
            f"tcp://127.0.0.1:{port}",
        )
        assert envs.envs_per_host == (2, 2, 2, 1)
        assert_same(envs.reset(seed=3), oracle.reset(seed=3))
        rng = np.random.default_rng(0)
        for _ in range(60):
            actions = rng.integers(0, 2, size=7)
            assert_same(envs.step(actions), oracle.step(actions))
    finally:
        envs.close()
        plain.stop()


def test_the_system_resolver_finds_localhost(replicas):
    host = replicas("127.0.0.1")
    port = replicas.port[0]
    assert resolve_dns("localhost", port)[0] == "127.0.0.1"
    envs = client.make_vec(HOSTED, num_envs=2, hosts=f"dns://localhost:{port}", **KWARGS)
    try:
        assert envs.hosts[0] == host.endpoint
        assert envs.reset(seed=0)[0].shape == (2, 4)
    finally:
        envs.close()


def test_min_hosts_waits_for_a_replica_that_comes_up_late(replicas):
    replicas("127.0.0.1")
    port = replicas.port[0]
    dns = FakeDns("127.0.0.1")

    def scale_up() -> None:  # the second replica starts once the client is waiting
        dns.looked_up.wait(60)
        replicas("127.0.0.2")
        dns.addresses.append("127.0.0.2")

    thread = threading.Thread(target=scale_up)
    thread.start()
    try:
        envs = client.make_vec(
            HOSTED,
            num_envs=4,
            hosts=[f"dns://envhost:{port}"],
            vector_kwargs={"resolver": dns, "min_hosts": 2},
            **KWARGS,
        )
    finally:
        thread.join()
    try:
        assert sorted(envs.hosts) == [f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.2:{port}"]
        assert dns.lookups > 1
    finally:
        envs.close()


def test_too_few_hosts_fail_clearly_naming_what_was_found(replicas):
    replicas("127.0.0.1")
    port = replicas.port[0]
    dns = FakeDns("127.0.0.1", "127.0.0.5")  # nothing serves on 127.0.0.5
    with pytest.raises(client.HostUnavailableError) as caught:
        client.make_vec(
            HOSTED,
            num_envs=2,
            hosts=[f"dns://envhost:{port}"],
            vector_kwargs={"resolver": dns, "min_hosts": 2, "connect_timeout_s": 5.0},
        )  # the wait is long enough for the live host to answer on a loaded machine
    message = str(caught.value)
    assert "within 5 s" in message and "min_hosts=2" in message
    assert f"answered: tcp://127.0.0.1:{port}" in message
    assert f"not answering: tcp://127.0.0.5:{port}" in message


def test_addresses_that_do_not_answer_are_left_out_once_enough_do(replicas):
    replicas("127.0.0.1")
    port = replicas.port[0]
    dns = FakeDns("127.0.0.5", "127.0.0.1")
    envs = client.make_vec(
        HOSTED, num_envs=2, hosts=[f"dns://envhost:{port}"], vector_kwargs={"resolver": dns}
    )
    try:
        assert envs.hosts == (f"tcp://127.0.0.1:{port}",)
    finally:
        envs.close()


def test_a_name_that_does_not_resolve_is_named_in_the_error():
    with pytest.raises(client.HostUnavailableError, match="dns://nowhere:5555 does not resolve"):
        client.make_vec(
            HOSTED,
            num_envs=1,
            hosts=["dns://nowhere:5555"],
            vector_kwargs={"resolver": FakeDns(), "connect_timeout_s": 1.0},
        )


def test_a_lost_host_is_replaced_by_resolving_the_name_again(replicas):
    first, second = replicas("127.0.0.1"), replicas("127.0.0.2")
    port = replicas.port[0]
    dns = FakeDns("127.0.0.1", "127.0.0.2")
    envs = client.make_vec(
        HOSTED,
        num_envs=4,
        hosts=[f"dns://envhost:{port}"],
        vector_kwargs={
            "resolver": dns,
            "min_hosts": 2,
            "on_host_failure": "restart",
            "host_timeout_s": 3.0,  # the live replica must not miss it on a loaded machine
        },
        **KWARGS,
    )
    try:
        envs.reset(seed=0)
        first.process.kill()  # the replica is replaced by one with a new address
        first.process.wait()
        replicas("127.0.0.3")
        dns.addresses = ["127.0.0.2", "127.0.0.3"]
        _, _, _, truncations, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert truncations[:2].all() and infos["_host_failure"].tolist() == [1, 1, 0, 0]
        assert envs.hosts == (f"tcp://127.0.0.3:{port}", second.endpoint)
        assert envs.host_restarts == 1
        assert envs.step(np.zeros(4, dtype=np.int64))[0].shape == (4, 4)
    finally:
        envs.close()


def test_replacements_prefer_the_same_address_then_free_ones_then_spares():
    dns = FakeDns("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.5")
    discovery = Discovery(["dns://envhost:5555", "tcp://sim-a:5555"], dns)
    for spec in discovery.specs:
        discovery.resolve(spec)
    discovery.answered = {"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555", "tcp://10.0.0.5:5555"}
    in_use = {"tcp://10.0.0.2:5555"}
    spares = ["tcp://spare:5555"]
    assert discovery.replacements("tcp://10.0.0.1:5555", in_use, spares) == [
        "tcp://10.0.0.1:5555",
        "tcp://10.0.0.5:5555",  # free, and it answered before
        "tcp://10.0.0.3:5555",  # free, never answered
        "tcp://spare:5555",
        "tcp://10.0.0.2:5555",  # in use by another connection
    ]
    dns.addresses = ["10.0.0.2", "10.0.0.4"]  # the lost one's address is gone: a new one first
    assert discovery.replacements("tcp://10.0.0.1:5555", in_use, spares) == [
        "tcp://10.0.0.4:5555",
        "tcp://10.0.0.1:5555",
        "tcp://spare:5555",
        "tcp://10.0.0.2:5555",
    ]
    dns.addresses = []  # nothing resolves now: retry where it was
    assert discovery.replacements("tcp://10.0.0.1:5555", in_use, []) == ["tcp://10.0.0.1:5555"]
    assert discovery.replacements("tcp://sim-a:5555", in_use, spares) == [
        "tcp://sim-a:5555",
        "tcp://spare:5555",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tcp://sim-a:5555", HostSpec("tcp://sim-a:5555")),
        ("ipc:///tmp/host.sock", HostSpec("ipc:///tmp/host.sock")),
        ("dns://envhost:5555", HostSpec("dns://envhost:5555", "envhost", 5555, "dns", 5555)),
        (
            "dns://envhost.ns.svc.cluster.local:6000",
            HostSpec(
                "dns://envhost.ns.svc.cluster.local:6000",
                "envhost.ns.svc.cluster.local",
                6000,
                "dns",
                6000,
            ),
        ),
        ("dns://[::1]:7000-7003", HostSpec("dns://[::1]:7000-7003", "::1", 7000, "dns", 7003)),
        ("slurm://job:5555", HostSpec("slurm://job:5555", "job", 5555, "slurm", 5555)),
        (
            "slurm://het-group-1:5555-5556",
            HostSpec("slurm://het-group-1:5555-5556", "het-group-1", 5555, "slurm", 5556),
        ),
        (
            "slurm://cpu[01-04,07]:5555",
            HostSpec("slurm://cpu[01-04,07]:5555", "cpu[01-04,07]", 5555, "slurm", 5555),
        ),
    ],
)
def test_host_specs_parse(text, expected):
    spec = HostSpec.parse(text)
    assert spec == expected
    assert list(spec.ports) == list(range(expected.port or 0, (expected.last_port or -1) + 1))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("dns://envhost", "is not a host spec: expected dns://NAME:PORT"),
        ("dns://:5555", "is not a host spec: expected dns://NAME:PORT"),
        ("dns://envhost:0", "the port must be a number from 1 to 65535 (or a range"),
        ("dns://h:x", "PORT-LAST), got 'x'"),
        ("dns://h:65536", "PORT-LAST), got '65536'"),
        ("dns://h:5555-", "PORT-LAST), got '5555-'"),
        ("dns://h:5556-5555", "the port range 5556-5555 ends before it begins"),
        ("slurm://job", "is not a host spec: expected slurm://NAME:PORT"),
        ("slurm://job:5555-65536", "PORT-LAST), got '5555-65536'"),
        ("dns://h:1-65535", "the port range 1-65535 spans more than 1024 ports"),
        ("tcp://127.0.0.1:99999", "the port must be a number from 1 to 65535, got '99999'"),
        ("tcp://127.0.0.1:560l", "the port must be a number from 1 to 65535, got '560l'"),
        ("tcp//x:1", "is not an endpoint: expected tcp://HOST:PORT"),
        ("tcp://*:5555", "binds every interface"),
        ("ipc://", "names no address"),
    ],
)
def test_bad_host_specs_are_refused(text, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        client.make_vec("CartPole-v1", num_envs=1, hosts=[text])


def test_min_hosts_beyond_the_named_hosts_or_without_hosts_is_refused():
    with pytest.raises(ValueError, match="names 1 host"):
        client.make_vec(
            "CartPole-v1", num_envs=2, hosts=["tcp://127.0.0.1:1"], vector_kwargs={"min_hosts": 2}
        )
    with pytest.raises(ValueError, match="only 1 env"):
        client.make_vec(
            "CartPole-v1", num_envs=1, hosts=["dns://a:1"], vector_kwargs={"min_hosts": 2}
        )
    with pytest.raises(ValueError, match="min_hosts needs hosts"):
        client.make_vec("CartPole-v1", num_envs=1, vector_kwargs={"min_hosts": 1})
    with pytest.raises(ValueError, match="positive integer"):
        client.make_vec(
            "CartPole-v1", num_envs=1, hosts=["dns://a:1"], vector_kwargs={"min_hosts": 0}
        )


def test_arguments_are_checked_before_any_wait():
    dns = FakeDns("127.0.0.1")
    with pytest.raises(ValueError, match="num_envs must be a positive integer"):
        client.make_vec("CartPole-v1", num_envs=0, hosts=["dns://envhost:1"])
    with pytest.raises(ValueError, match="envs_per_host needs a host list without dns://"):
        client.make_vec(
            "CartPole-v1",
            num_envs=2,
            hosts=["dns://envhost:1"],
            vector_kwargs={"resolver": dns, "envs_per_host": [1, 1]},
        )
    assert dns.lookups == 0


def test_waiting_resolves_in_rounds_not_in_a_busy_loop():
    dns = FakeDns()  # resolves to nothing, for the whole wait
    with pytest.raises(client.HostUnavailableError, match="resolves to no address"):
        client.make_vec(
            "CartPole-v1",
            num_envs=1,
            hosts=["dns://envhost:5555"],
            vector_kwargs={"resolver": dns, "connect_timeout_s": 2.0},
        )
    assert 2 <= dns.lookups <= 10  # a lookup every 0.5 s round


def test_more_replicas_than_envs_use_one_per_env(replicas):
    for address in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
        replicas(address)
    port = replicas.port[0]
    dns = FakeDns("127.0.0.1", "127.0.0.2", "127.0.0.3")
    envs = client.make_vec(
        "CartPole-v1", num_envs=2, hosts=f"dns://envhost:{port}", vector_kwargs={"resolver": dns}
    )
    try:
        assert envs.hosts == (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.2:{port}")
    finally:
        envs.close()


def test_a_host_reached_at_two_endpoints_counts_once(replicas):
    host = replicas("127.0.0.1")
    port = replicas.port[0]
    dns = FakeDns("127.0.0.1")
    plain = f"tcp://localhost:{port}"  # the same host process, named another way
    with pytest.raises(client.HostUnavailableError, match="min_hosts=2"):
        client.make_vec(
            "CartPole-v1",
            num_envs=2,
            hosts=[plain, f"dns://envhost:{port}"],
            vector_kwargs={"resolver": dns, "min_hosts": 2, "connect_timeout_s": 5.0},
        )
    envs = client.make_vec(
        "CartPole-v1",
        num_envs=2,
        hosts=[plain, f"dns://envhost:{port}"],
        vector_kwargs={"resolver": dns},
    )
    try:
        assert envs.hosts == (plain,) and host.endpoint == f"tcp://127.0.0.1:{port}"
    finally:
        envs.close()


def test_a_plain_endpoint_that_does_not_answer_is_named_after_one_wait(replicas):
    replicas("127.0.0.1")
    port = replicas.port[0]
    silent = "tcp://127.0.0.7:1"
    with pytest.raises(client.HostUnavailableError, match=r"within 5 s") as caught:
        client.make_vec(
            "CartPole-v1",
            num_envs=2,
            hosts=[silent, f"dns://envhost:{port}"],
            vector_kwargs={"resolver": FakeDns("127.0.0.1"), "connect_timeout_s": 5.0},
        )
    assert f"{silent} did not answer" in str(caught.value)
