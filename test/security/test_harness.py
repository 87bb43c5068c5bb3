"""The security suite's harness on a healthy server: a bystander is measured, the server is whole."""

import pytest
import requests

from sglang.test.security_probe import Bystander, assert_server_whole, error_message

pytestmark = pytest.mark.server


def test_bystander_and_whole_server(plain_server):
    url = plain_server["url"]
    with Bystander(url) as b:
        r = requests.post(url + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 4}}, timeout=60)
        bad = requests.post(url + "/generate", json={"text": "x", "sampling_params": {"temperature": -1}}, timeout=60)
    assert r.status_code == 200
    assert bad.status_code == 400 and "temperature" in error_message(bad)
    b.assert_responsive()
    assert len(b.latencies) >= 1
    assert_server_whole(url)
