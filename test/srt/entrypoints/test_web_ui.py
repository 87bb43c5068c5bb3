"""The built-in web page of a real server behind --api-key: its JSON route without a browser, then
headless Chromium (Debian's, installed when missing) loads the page, is asked for the key, chats
with a streamed answer, sees the live view's numbers move while a long request runs, stops a
stream mid-way (the server frees the request), and takes a screenshot."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from sglang.test.server_utils import find_free_port, popen_launch_server, stop_server
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

API_KEY = "sk-web-test"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_model(str(tmp_path_factory.mktemp("web_llama")), "llama", max_position_embeddings=4096)
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("log") / "server.log")
    proc = popen_launch_server(model, port, ["--max-total-tokens", "8192"], api_key=API_KEY, log_path=log)
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


def _long_request(url: str, n: int = 1500) -> threading.Thread:
    def run():
        requests.post(url + "/generate", headers=AUTH, timeout=300, json={
            "text": "a long one", "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}})

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_page_is_public_but_its_data_needs_the_key(server):
    page = requests.get(server + "/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>SGLang</title>" in page.text and "/web/app.js" in page.text
    assert requests.get(server + "/web/app.js", timeout=30).headers["content-type"].startswith("application/javascript")
    assert requests.get(server + "/web/style.css", timeout=30).status_code == 200
    assert requests.get(server + "/web/secrets.txt", timeout=30).status_code == 404
    assert requests.get(server + "/dashboard/state", timeout=30).status_code == 401
    assert requests.get(server + "/v1/models", timeout=30).status_code == 401


def test_dashboard_state_moves_while_a_request_runs(server):
    before = requests.get(server + "/dashboard/state", headers=AUTH, timeout=30).json()
    assert before["mode"] == "null" and before["kv_tokens"]["total"] == 8192
    assert before["num_running_reqs"] == 0 and before["kv_tokens"]["used"] == 0
    t = _long_request(server, 600)
    busy = _wait(lambda: (s := requests.get(server + "/dashboard/state", headers=AUTH, timeout=30).json())
                 ["num_running_reqs"] == 1 and s, 60, "the request to run")
    assert busy["kv_tokens"]["used"] > 0
    t.join(timeout=300)
    after = requests.get(server + "/dashboard/state", headers=AUTH, timeout=30).json()
    assert after["num_running_reqs"] == 0 and after["kv_tokens"]["used"] == 0
    assert after["num_requests"] == before["num_requests"] + 1
    assert after["generation_tokens"] == before["generation_tokens"] + 600


def test_chat_dashboard_and_stop_in_a_real_browser(server, tmp_path):
    from sglang.test.browser import chromium_missing_reason, headless_chromium

    reason = chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    driver = headless_chromium()
    wait = WebDriverWait(driver, 60)
    try:
        driver.get(server + "/")
        wait.until(EC.alert_is_present())  # the API asked for the key
        alert = driver.switch_to.alert
        alert.send_keys(API_KEY)
        alert.accept()
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#model option"))
        def stat(name):  # read in one script call: the live view refreshes every second
            return driver.execute_script(
                "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
                f'.stat[data-name="{name}"] b')

        wait.until(lambda d: stat("running") == "0")

        # chat: a streamed answer shows up, with its speed
        driver.find_element(By.ID, "temperature").clear()
        driver.find_element(By.ID, "temperature").send_keys("0")
        driver.find_element(By.ID, "prompt").send_keys("Hello there")
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".msg.assistant .body").text.strip())
        wait.until(lambda d: "tok/s" in d.find_element(By.ID, "speed").text)
        assert driver.find_element(By.CSS_SELECTOR, ".msg.user .body").text == "Hello there"
        assert not driver.find_element(By.ID, "error").is_displayed()

        # the live view follows a long request started elsewhere
        generated = int(stat("generated tokens") or 0)
        # (long enough that the page's 1 s refresh sees it running: 1200 tokens of the tiny model
        # were sometimes over within one refresh once decode got faster)
        t = _long_request(server, 3500)
        wait.until(lambda d: stat("running") == "1")
        wait.until(lambda d: int(stat("generated tokens")) > generated)
        t.join(timeout=300)
        wait.until(lambda d: stat("running") == "0")

        # stop: a long streamed answer is cut; the server frees the request
        max_tokens = driver.find_element(By.ID, "max-tokens")
        max_tokens.clear()
        max_tokens.send_keys("3000")
        driver.find_element(By.ID, "prompt").send_keys("Tell me everything")
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2
                   and d.find_elements(By.CSS_SELECTOR, ".msg.assistant .body")[1].text.strip())
        driver.find_element(By.ID, "stop").click()
        wait.until(lambda d: d.find_element(By.ID, "send").is_enabled())
        _wait(lambda: requests.get(server + "/dashboard/state", headers=AUTH, timeout=30).json()["num_running_reqs"] == 0,
              30, "the stopped request to be freed")
        state = requests.get(server + "/dashboard/state", headers=AUTH, timeout=30).json()
        assert state["kv_tokens"]["used"] == 0

        shot = tmp_path / "page.png"
        assert driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
    finally:
        driver.quit()
