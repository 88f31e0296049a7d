"""A real headless Debian chromium driven through chromedriver (selenium), for the status page.

`make test` installs both (`make browser`); without them the page's tests fail and say so.
"""

from __future__ import annotations

import base64
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)


def _find(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


@contextmanager
def chromium(profile: Path, width: int = 1440, height: int = 1000) -> Iterator[WebDriver]:
    """A fresh browser with its own profile directory; quits (and so stops chromium) on exit."""
    binary = _find("chromium", "chromium-browser")
    driver_bin = _find("chromedriver")
    if binary is None or driver_bin is None:
        pytest.fail(
            "chromium and chromedriver are needed for the status page tests: run `make browser` "
            "(apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=DriverService(driver_bin), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_until(driver: WebDriver, cond: Callable[[WebDriver], Any], what: str, timeout: float = 60) -> Any:
    """Poll ``cond`` until truthy (stale elements count as not yet); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond(driver)
        except (StaleElementReferenceException, WebDriverException) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def model_row(driver: WebDriver, name: str) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, f'tbody.model[data-model="{name}"]')


def row_state(driver: WebDriver, name: str) -> str | None:
    rows = driver.find_elements(By.CSS_SELECTOR, f'tbody.model[data-model="{name}"]')
    return rows[0].get_attribute("data-state") if rows else None


def cell(driver: WebDriver, name: str, label: str) -> str:
    return str(model_row(driver, name).find_element(By.CSS_SELECTOR, f'td[data-label="{label}"]').text)


def full_page_screenshot(driver: WebDriver, path: Path, width: int) -> Path:
    """The whole page laid out ``width`` CSS pixels wide, captured beyond the viewport (CDP)."""
    driver.set_window_size(width, 900)
    driver.execute_script("window.scrollTo(0, 0)")
    # Two animation frames: the resize has been laid out and painted.
    driver.execute_async_script(
        "const done = arguments[0]; requestAnimationFrame(() => requestAnimationFrame(done));"
    )
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 8000), "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def prefer_color_scheme(driver: WebDriver, scheme: str) -> None:
    """Emulate the OS's light or dark preference (the page follows prefers-color-scheme)."""
    feature = {"name": "prefers-color-scheme", "value": scheme}
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [feature]})


def severe_console_errors(driver: WebDriver, allow: tuple[str, ...] = ()) -> list[str]:
    """Console errors (CSP violations and script errors among them), minus the allowed ones."""
    out = []
    for entry in driver.get_log("browser"):
        if entry.get("level") == "SEVERE" and not any(a in entry.get("message", "") for a in allow):
            out.append(entry["message"])
    return out
