"""Bootstrap HTTP server (reference 5.4) over real loopback HTTP: routes, topology, exact error texts."""

import socket

import pytest
import requests

from sglang.srt.disaggregation.bootstrap_server import KVBootstrapServer
from sglang.srt.utils import get_free_port

T = 5  # every request bounded


@pytest.fixture
def server():
    srv = KVBootstrapServer("127.0.0.1", get_free_port())
    yield srv, f"http://127.0.0.1:{srv.port}"
    srv.close()


def _reg(tp_rank=0, tp_size=1, dp_rank=0, dp_size=1, port=40000, **extra):
    payload = {
        "attn_tp_size": tp_size,
        "attn_tp_rank": tp_rank,
        "attn_cp_size": 1,
        "attn_cp_rank": 0,
        "attn_dp_size": 1,
        "attn_dp_rank": 0,
        "pp_size": 1,
        "pp_rank": 0,
        "system_dp_size": dp_size,
        "system_dp_rank": dp_rank,
        "rank_ip": "127.0.0.1",
        "rank_port": port,
        "page_size": 16,
        "kv_cache_dtype": "bfloat16",
        "load_balance_method": "follow_bootstrap_room",
        "decode_allocation_policy": "early",
        "prefill_http_port": 30100,
    }
    payload.update(extra)
    return payload


ALL = {"prefill_dp_rank": -1, "prefill_cp_rank": -1, "target_tp_rank": -1, "target_pp_rank": -1}


def _rank(dp, tp):
    return {"prefill_dp_rank": dp, "prefill_cp_rank": 0, "target_tp_rank": tp, "target_pp_rank": 0}


def test_health(server):
    _, url = server
    r = requests.get(f"{url}/health", timeout=T)
    assert r.status_code == 200 and r.text == "OK"


def test_missing_inputs_and_method_not_allowed(server):
    _, url = server
    r = requests.get(f"{url}/route", params={"prefill_dp_rank": 0}, timeout=T)
    assert (r.status_code, r.text) == (400, "Missing inputs for bootstrap server.")
    r = requests.post(f"{url}/route", json={}, timeout=T)
    assert (r.status_code, r.text) == (405, "Method not allowed")
    r = requests.delete(f"{url}/route", timeout=T)
    assert (r.status_code, r.text) == (405, "Method not allowed")


def test_registration_topology_and_lookup(server):
    _, url = server
    r = requests.get(f"{url}/route", params=ALL, timeout=T)
    assert (r.status_code, r.text) == (503, "Prefill server not fully registered yet (0 workers registered).")
    # two TP ranks x two system DP ranks; after three the server is still not ready
    regs = [(dp, tp) for dp in range(2) for tp in range(2)]
    for i, (dp, tp) in enumerate(regs):
        r = requests.put(f"{url}/route", json=_reg(tp_rank=tp, tp_size=2, dp_rank=dp, dp_size=2, port=40000 + i), timeout=T)
        assert (r.status_code, r.text) == (200, "OK")
        if i == 2:
            r = requests.get(f"{url}/route", params=ALL, timeout=T)
            assert (r.status_code, r.text) == (503, "Prefill server not fully registered yet (3 workers registered).")
    info = requests.get(f"{url}/route", params=ALL, timeout=T).json()
    assert info == {
        "attn_tp_size": 2,
        "attn_cp_size": 1,
        "dp_size": 2,
        "pp_size": 1,
        "page_size": 16,
        "kv_cache_dtype": "bfloat16",
        "follow_bootstrap_room": True,
        "enable_dsa_cache_layer_split": False,
        "decode_allocation_policy": "early",
        "enable_kv_cache_sharding": False,
        "prefill_http_port": 30100,
    }
    for i, (dp, tp) in enumerate(regs):
        r = requests.get(f"{url}/route", params=_rank(dp, tp), timeout=T)
        assert r.status_code == 200 and r.json() == {"rank_ip": "127.0.0.1", "rank_port": 40000 + i}
    r = requests.get(f"{url}/route", params=_rank(5, 0), timeout=T)
    assert (r.status_code, r.text) == (404, "Bootstrap info not found for dp_rank=5 cp_rank=0 tp_rank=0 pp_rank=0")
    # re-registration of a rank (restart) replaces its endpoint
    requests.put(f"{url}/route", json=_reg(tp_rank=1, tp_size=2, dp_rank=1, dp_size=2, port=41111), timeout=T)
    assert requests.get(f"{url}/route", params=_rank(1, 1), timeout=T).json()["rank_port"] == 41111


def test_inconsistent_allocation_policy_rejected(server):
    _, url = server
    assert requests.put(f"{url}/route", json=_reg(tp_size=2), timeout=T).status_code == 200
    r = requests.put(f"{url}/route", json=_reg(tp_rank=1, tp_size=2, decode_allocation_policy="prefill_complete"), timeout=T)
    assert (r.status_code, r.text) == (400, "Inconsistent prefill allocation policies")


def test_kv_layout_reported_when_set(server):
    _, url = server
    requests.put(f"{url}/route", json=_reg(kv_layout="page_major"), timeout=T)
    assert requests.get(f"{url}/route", params=ALL, timeout=T).json()["kv_layout"] == "page_major"


def test_dp_rank_registry_and_expiry(server, monkeypatch):
    srv, url = server
    assert requests.post(f"{url}/register_dp_rank", json={"bootstrap_room": 11, "dp_rank": 3}, timeout=T).text == "OK"
    requests.post(f"{url}/register_dp_rank", json={"bootstrap_room": 12, "dp_rank": 0}, timeout=T)
    r = requests.post(f"{url}/query_dp_ranks", json={"bootstrap_rooms": [11, 12, 13]}, timeout=T)
    assert r.json() == {"11": 3, "12": 0}
    srv.entry_cleanup_interval = 0.0  # every entry is now older than the interval
    assert requests.post(f"{url}/query_dp_ranks", json={"bootstrap_rooms": [11, 12]}, timeout=T).json() == {}


def test_bind_error_raises_and_close_frees_port():
    port = get_free_port()
    srv = KVBootstrapServer("127.0.0.1", port)
    with pytest.raises(OSError):
        KVBootstrapServer("127.0.0.1", port)
    srv.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=T)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
