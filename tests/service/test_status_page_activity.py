"""The status page's Activity view, in a real headless chromium against a real `forge serve`.

Capture is on: an admin opens a row and reads the prompt and the reply; the filters narrow the
table; a key that is not an admin sees its own rows and, opening one, the service's refusal.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from tests.support.browser import chromium, full_page_screenshot, severe_console_errors, wait_until
from tests.support.service import running_service, write_config

ADMIN = "page-activity-admin-key"
READER = "page-activity-reader-key"


def _rows(d: WebDriver) -> list[str]:
    return [str(r.text) for r in d.find_elements(By.CSS_SELECTOR, "#activity tbody tr.req")]


def _login(d: WebDriver, key: str) -> None:
    field = d.find_element(By.ID, "login-key")
    wait_until(d, lambda d: field.is_displayed(), "the login form")
    field.send_keys(key, Keys.ENTER)
    wait_until(d, lambda d: d.find_element(By.ID, "app").is_displayed(), "the page after the key")


def test_activity_view_filters_and_opens_captured_requests(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    cfg = write_config(
        tmp_path / "forge.toml",
        f'[server]\napi_key = "{ADMIN}"\ncapture = true\n'
        f'[[server.keys]]\nname = "reader"\nkey = "{READER}"\n'
        f'[models.tiny]\npath = "{tiny_gguf}"\ngpu = "cpu"\nctx_size = 512\npreload = true\n',
    )
    marker = "pangolin-saffron-page"
    with (
        running_service(cfg, tmp_path / "state", llama_server_bin, api_key=ADMIN) as svc,
        chromium(tmp_path / "profile") as d,
    ):
        body = {"model": "tiny", "messages": [{"role": "user", "content": marker}], "max_tokens": 3}
        admin = {"Authorization": f"Bearer {ADMIN}"}
        reply = httpx.post(f"{svc.url}/v1/chat/completions", json=body, headers=admin, timeout=60).json()
        text = reply["choices"][0]["message"]["content"]
        missing = httpx.post(f"{svc.url}/v1/chat/completions", json={**body, "model": "nope"}, headers=admin)
        assert missing.status_code == 404
        reader = {"Authorization": f"Bearer {READER}"}
        assert (
            httpx.post(f"{svc.url}/v1/chat/completions", json=body, headers=reader, timeout=60).status_code
            == 200
        )

        d.get(svc.url + "/")
        _login(d, ADMIN)
        wait_until(d, lambda d: len(_rows(d)) == 3, "three requests in the Activity table")
        assert any("404" in r for r in _rows(d)) and any("reader" in r for r in _rows(d))

        status = d.find_element(By.ID, "activity-status")
        status.send_keys("404")
        wait_until(d, lambda d: len(_rows(d)) == 1 and "404" in _rows(d)[0], "the 404 row alone")
        status.clear()
        status.send_keys(Keys.BACKSPACE)  # an input event for the cleared field
        d.find_element(By.ID, "activity-key").send_keys("api_key")
        wait_until(d, lambda d: len(_rows(d)) == 2, "the admin's two rows")

        ok = next(r for r in d.find_elements(By.CSS_SELECTOR, "#activity tbody tr.req") if "200" in r.text)
        ok.click()
        detail = d.find_element(By.CSS_SELECTOR, "#activity .activity-detail")
        wait_until(d, lambda d: marker in detail.text, "the captured prompt in the detail")
        assert text in detail.find_element(By.CSS_SELECTOR, ".response-body pre").text
        assert ADMIN not in detail.text
        full_page_screenshot(d, tmp_path / "activity.png", 1440)
        assert severe_console_errors(d, allow=("401",)) == []  # the page's first look, before the key

        d.find_element(By.ID, "logout").click()
        _login(d, READER)
        wait_until(d, lambda d: len(_rows(d)) == 1 and "reader" in _rows(d)[0], "the reader's own row only")
        row = d.find_element(By.CSS_SELECTOR, "#activity tbody tr.req")
        row.send_keys(Keys.ENTER)  # the keyboard opens a row too
        wait_until(d, lambda d: "admin key" in detail.text, "the refusal of captured bodies")
        assert marker not in detail.text
        assert severe_console_errors(d, allow=("401", "403")) == []
