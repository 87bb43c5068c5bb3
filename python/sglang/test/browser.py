"""A real headless browser for tests of the built-in web page: Debian's Chromium and ChromeDriver
(packages `chromium`, `chromium-driver`), installed with apt-get when missing, driven by Selenium.

`chromium_missing_reason()` returns None when the browser is there (after installing it if it can)
or the reason it is not, for `pytest.skip`."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Optional

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def _installed() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def chromium_missing_reason() -> Optional[str]:
    if _installed():
        return None
    apt = shutil.which("apt-get")
    if apt is None:
        return "chromium is not installed and there is no apt-get to install it"
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None:
        return "chromium is not installed and installing it needs root (no sudo)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = sudo + [apt, "install", "-y", "-qq", "chromium", "chromium-driver"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:  # stale package lists: update once, then try again
        subprocess.run(sudo + [apt, "update", "-qq"], capture_output=True, env=env, timeout=900)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0 or not _installed():
        return f"could not install chromium: {(r.stderr or r.stdout).strip()[-300:]}"
    return None


def headless_chromium(width: int = 1400, height: int = 1000):
    """A Selenium WebDriver on headless Chromium (quit() it when done)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
