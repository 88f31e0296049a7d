"""The status page for a key scoped to one model, and the parts a new user tripped over, in a real
headless chromium against a real `forge serve` (llama-server on a tiny GGUF, a whisper model beside
it): a scoped key sees its model only and no admin control; Try it offers chat models only; a click
on an Activity row brings its detail into view; event badges never cover their text at 1280 and
1024 px (a kept context's "context saved" / "context restored" are the widest)."""

from __future__ import annotations

from pathlib import Path

import httpx
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from rocmforge_supervisor.config import ForgeSettings
from tests.support.browser import chromium, severe_console_errors, wait_until
from tests.support.service import FAST, running_service, write_config
from tests.support.whisper import whisper_model_or_skip, whisper_server_or_skip

ADMIN = "page-keys-admin-key"
ALICE = "page-keys-alice-key"

_IN_VIEW = """
const r = arguments[0].getBoundingClientRect();
return r.top < window.innerHeight && r.bottom > 0;
"""

# Every event row whose badge runs over the text beside it: [badge right, detail left, text].
_OVERLAPS = """
return [...document.querySelectorAll("#events li.event")].map((li) => {
  const b = li.querySelector(".badge").getBoundingClientRect();
  const t = li.querySelector(".ev-detail").getBoundingClientRect();
  const sameLine = b.bottom > t.top && t.bottom > b.top;
  return sameLine && t.width > 0 && b.right > t.left + 0.5 ? [b.right, t.left, li.textContent] : null;
}).filter(Boolean);
"""


def _login(d: WebDriver, key: str) -> None:
    field = d.find_element(By.ID, "login-key")
    wait_until(d, lambda d: field.is_displayed(), "the login form")
    field.send_keys(key, Keys.ENTER)
    wait_until(d, lambda d: d.find_element(By.ID, "app").is_displayed(), "the page after the key")


def _rows(d: WebDriver) -> list[str]:
    return [str(r.get_attribute("data-model")) for r in d.find_elements(By.CSS_SELECTOR, "tbody.model")]


def _chat_models(d: WebDriver) -> list[str]:
    return [str(o.get_attribute("value")) for o in d.find_elements(By.CSS_SELECTOR, "#chat-model option")]


def _visible_buttons(d: WebDriver) -> list[str]:
    return [str(b.text) for b in d.find_elements(By.CSS_SELECTOR, "tbody.model button") if b.is_displayed()]


def test_a_scoped_key_sees_its_model_and_no_control_and_the_page_fits(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path, forge_settings: ForgeSettings
) -> None:
    whisper_bin = whisper_server_or_skip(forge_settings)
    stt, _real = whisper_model_or_skip(forge_settings)
    cfg = write_config(
        tmp_path / "forge.toml",
        FAST
        + f'[server]\napi_key = "{ADMIN}"\n'
        + f'[[server.keys]]\nname = "alice"\nkey = "{ALICE}"\nmodels = ["a"]\n'
        + f'[models.a]\npath = "{tiny_gguf}"\ngpu = "cpu"\nctx_size = 512\nparallel = 1\npreload = true\n'
        + "keep_context = true\nkeep_conversations = true\n"
        + f'[models.b]\npath = "{tiny_gguf}"\ngpu = "cpu"\nctx_size = 512\n'
        + f'[models.stt]\npath = "{stt}"\nbackend = "whisper"\n',
    )
    env = {"FORGE_WHISPER_SERVER": str(whisper_bin)}
    with (
        running_service(cfg, tmp_path / "state", llama_server_bin, api_key=ADMIN, extra_env=env) as svc,
        chromium(tmp_path / "profile", 1280, 800) as d,
    ):
        admin = {"Authorization": f"Bearer {ADMIN}"}
        alice = {"Authorization": f"Bearer {ALICE}"}
        chat = {"model": "a", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
        assert (
            httpx.post(f"{svc.url}/v1/chat/completions", json=chat, headers=alice, timeout=60).status_code
            == 200
        )
        # A kept context: unload saves the slot, the next request restores it (the widest badges).
        assert httpx.post(f"{svc.url}/api/models/a/unload", headers=admin, timeout=60).status_code == 200
        assert (
            httpx.post(f"{svc.url}/v1/chat/completions", json=chat, headers=alice, timeout=60).status_code
            == 200
        )
        for _ in range(40):  # a long Activity table: the detail opens below all its rows
            r = httpx.post(
                f"{svc.url}/tokenize", json={"model": "a", "content": "hi"}, headers=alice, timeout=30
            )
            assert r.status_code == 200, r.text

        d.get(svc.url + "/")
        _login(d, ADMIN)
        wait_until(d, lambda d: sorted(_rows(d)) == ["a", "b", "stt"], "every model for the admin")
        wait_until(d, lambda d: _chat_models(d) == ["a", "b"], "chat models only in Try it")
        wait_until(d, lambda d: "Unload" in _visible_buttons(d), "the admin's controls")
        assert d.find_element(By.ID, "reload-config").is_displayed()

        row_a = d.find_element(By.CSS_SELECTOR, 'tbody.model[data-model="a"]')
        # The second chat was a first turn again (one user message): nothing found, nothing missed.
        wait_until(d, lambda d: "conversations: 0 found · 0 restored" in row_a.text, "the tier's line")
        events = d.find_element(By.ID, "events")
        wait_until(d, lambda d: "context restored" in events.text, "the restore in the events")
        for width in (1280, 1024):
            d.set_window_size(width, 800)
            assert d.execute_script(_OVERLAPS) == [], f"badges over their text at {width} px"

        d.find_element(By.ID, "logout").click()
        _login(d, ALICE)
        wait_until(d, lambda d: _rows(d) == ["a"], "alice's one model")
        wait_until(d, lambda d: _chat_models(d) == ["a"], "alice's model in Try it")
        assert _visible_buttons(d) == [] and not d.find_element(By.ID, "reload-config").is_displayed()

        rows = d.find_elements(By.CSS_SELECTOR, "#activity tbody tr.req")
        wait_until(
            d, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#activity tbody tr.req")) >= 40, "the rows"
        )
        first = d.find_elements(By.CSS_SELECTOR, "#activity tbody tr.req")[0]
        d.execute_script("arguments[0].scrollIntoView({block: 'center'})", first)
        detail = d.find_element(By.CSS_SELECTOR, "#activity .activity-detail")
        assert not d.execute_script(_IN_VIEW, detail) or detail.get_attribute("hidden") is not None
        first.click()
        wait_until(
            d, lambda d: "status" in detail.text and d.execute_script(_IN_VIEW, detail), "the detail in view"
        )
        assert rows  # (read before the wait: the table was there from the first refresh)
        assert severe_console_errors(d, allow=("401", "403")) == []
