"""The test helpers' ports: no two launches in one test process get the same port."""

from sglang.test.server_utils import find_free_port


def test_find_free_port_never_hands_out_a_port_twice():
    # The kernel offers recently closed ephemeral ports again: 2000 probes of ~28k ports repeat
    # one almost surely, which once put a router on its decode server's port.
    ports = [find_free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    assert all(1024 < p < 65536 for p in ports)
