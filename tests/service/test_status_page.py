"""The status page at `/`, in a real headless chromium against a real `forge serve` and llama-server.

Everything is checked through what the browser shows and does (rows, buttons, the log tail, the
chat box); the service's JSON and the process table are only used to confirm it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import httpx
import psutil
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from tests.support.browser import (
    cell,
    chromium,
    full_page_screenshot,
    model_row,
    prefer_color_scheme,
    row_state,
    severe_console_errors,
    wait_until,
)
from tests.support.service import FAST, running_service, wait_for, write_config

# Records, from inside the page, every state the row shows and whether the load progress bar was
# visible meanwhile: a load of the small model takes about a second, shorter than a poll loop.
_WATCH_ROW = """
const [name] = arguments;
window.__seen = [];
const row = document.querySelector(`tbody.model[data-model="${name}"]`);
const note = () => window.__seen.push({
  state: row.dataset.state,
  progress: !row.querySelector(".progress").hidden,
  text: row.querySelector(".progress-text").textContent,
});
new MutationObserver(note).observe(row, {subtree: true, attributes: true, childList: true, characterData: true});
"""

_WATCH_REPLY = """
window.__reply = [];
const log = document.getElementById("chat-log");
new MutationObserver(() => {
  const last = log.querySelector("li.assistant:last-child .text");
  if (last) window.__reply.push(last.textContent.length);
}).observe(log, {subtree: true, childList: true, characterData: true});
"""


def _config(tmp_path: Path, model: Path, name: str, server: str = "", **kw: object) -> Path:
    lines = [f"[models.{name}]", f'path = "{model}"', 'gpu = "cpu"', "preload = true"]
    kw.setdefault("ctx_size", 1024)
    for k, v in kw.items():
        lines.append(f"{k} = {json.dumps(v)}")
    return write_config(tmp_path / "forge.toml", FAST + server + "\n".join(lines) + "\n")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tab_to(driver: WebDriver, selector: str, limit: int = 60) -> None:
    """Press Tab from the top of the page until ``selector`` has the focus (keyboard navigation)."""
    driver.find_element(By.TAG_NAME, "body").click()
    target = driver.find_element(By.CSS_SELECTOR, selector)
    for _ in range(limit):
        driver.switch_to.active_element.send_keys(Keys.TAB)
        if driver.switch_to.active_element == target:
            return
    raise AssertionError(f"{selector} was not reached with {limit} Tab presses")


@pytest.mark.slow
@pytest.mark.timeout(300)  # three loads and a generation of the real model, in a browser
def _recorded_machine_env(key: str) -> dict[str, str]:
    """Discovery reads a recorded machine (a 7800 XT and a 780M iGPU), and the service wants
    ``key``: the Devices panel has a GPU bar and a skipped iGPU; the models run on the CPU."""
    machine = Path(__file__).parents[1] / "fixtures" / "sysfs" / "apu780m_rx7800xt"
    return {
        "FORGE_API_KEY": key,
        "FORGE_SYSFS_ROOT": str(machine / "sys"),
        "FORGE_DEV_ROOT": str(machine / "dev"),
        "FORGE_USE_AMDSMI": "0",
        "FORGE_USE_NVML": "0",
    }


def test_status_page_live_actions_crash_and_chat(
    tmp_path: Path, smollm2_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    cfg = _config(tmp_path, smollm2_path, "smollm2", parallel=2, ttl=900, pinned=True)
    with cfg.open("a") as f:  # a second model whose child refuses its arguments: a failed row
        f.write(
            f'[models.broken]\npath = "{tiny_gguf}"\ngpu = "cpu"\npreload = true\nargs = ["--no-such-flag"]\n'
        )
    with (
        running_service(cfg, tmp_path / "state", llama_server_bin) as svc,
        chromium(tmp_path / "profile") as d,
    ):
        page = httpx.get(f"{svc.url}/")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
        assert "content-security-policy" in httpx.get(f"{svc.url}/ui/app.js").headers

        d.get(svc.url + "/")
        wait_until(d, lambda d: row_state(d, "smollm2") == "ready", "the model row to say ready")
        pid = svc.model("smollm2")["pid"]
        wait_until(d, lambda d: cell(d, "smollm2", "PID · port").startswith(str(pid)), "the pid in the row")
        wait_until(d, lambda d: "held by smollm2" in d.find_element(By.ID, "devices").text, "the CPU bar")
        assert d.find_elements(By.CSS_SELECTOR, 'li[data-device="cpu"] .bar .seg.ours')
        assert "no TTL" not in cell(d, "smollm2", "TTL left")
        # Its residency rules under its name (issue 33); the other model has none to show.
        assert model_row(d, "smollm2").find_element(By.CSS_SELECTOR, ".rules").text == "pinned"
        assert not model_row(d, "broken").find_element(By.CSS_SELECTOR, ".rules").is_displayed()

        # The failed model: its reason and the child's last stderr lines, in its row.
        wait_until(d, lambda d: row_state(d, "broken") == "failed", "the failed row")
        failure = model_row(d, "broken").find_element(By.CSS_SELECTOR, ".failure")
        assert "bad_args" in failure.text
        assert "--no-such-flag" in failure.find_element(By.CSS_SELECTOR, "pre.stderr").text

        # The log tail follows the child's log.
        model_row(d, "smollm2").find_element(By.CSS_SELECTOR, "details.log summary").click()
        log_text = model_row(d, "smollm2").find_element(By.CSS_SELECTOR, ".log-text")
        wait_until(d, lambda d: log_text.get_attribute("textContent").count("\n") >= 20, "the log tail")
        assert "llama" in log_text.get_attribute("textContent")

        # Try it: the reply streams in (several partial renders), then TTFT and tokens/s.
        d.execute_script(_WATCH_REPLY)
        max_tokens = d.find_element(By.ID, "chat-max")
        max_tokens.clear()
        max_tokens.send_keys("40")
        d.find_element(By.ID, "chat-prompt").send_keys("Write one sentence about the sea.")
        d.find_element(By.ID, "chat-send").click()
        stats = d.find_element(By.ID, "chat-stats")
        wait_until(
            d, lambda d: stats.get_attribute("data-done") == "1", "the chat reply to finish", timeout=120
        )
        assert "TTFT" in stats.text and "tokens/s" in stats.text, stats.text
        reply = d.find_elements(By.CSS_SELECTOR, "#chat-log li.assistant .text")[-1].text
        assert reply.strip()
        lengths = d.execute_script("return window.__reply")
        assert len(set(lengths)) >= 3, f"the reply did not stream: {lengths}"
        wait_until(d, lambda d: cell(d, "smollm2", "Requests").startswith("0/"), "the chat's slot given back")

        # Screenshots (the log panel closed: the failed row's stderr block already shows one).
        d.execute_script(
            "arguments[0].open = false", model_row(d, "smollm2").find_element(By.CSS_SELECTOR, "details.log")
        )
        prefer_color_scheme(d, "light")
        full_page_screenshot(d, tmp_path / "status-desktop.png", 1440)
        if os.environ.get("FORGE_PAGE_SCREENSHOT"):  # how docs/status-page.png is made
            shutil.copy(tmp_path / "status-desktop.png", os.environ["FORGE_PAGE_SCREENSHOT"])
        full_page_screenshot(d, tmp_path / "status-phone.png", 390)
        assert d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")
        prefer_color_scheme(d, "dark")
        full_page_screenshot(d, tmp_path / "status-phone-dark.png", 390)
        full_page_screenshot(d, tmp_path / "status-desktop-dark.png", 1440)
        background = d.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(15, 18, 22)", background  # the dark palette is in use
        d.set_window_size(1440, 1000)

        # Unload with the keyboard: Tab to the button, Enter. The row says stopped; the child is gone.
        _tab_to(d, 'tbody.model[data-model="smollm2"] button[data-action="unload"]')
        d.switch_to.active_element.send_keys(Keys.ENTER)
        wait_until(d, lambda d: row_state(d, "smollm2") == "stopped", "the row to say stopped")
        wait_for(lambda: not _alive(pid), timeout=15, what="the child to exit")
        assert svc.llama_children() == []
        assert cell(d, "smollm2", "PID · port") == "–"

        # Load with the button: the progress shows while loading, then ready with a new child.
        d.execute_script(_WATCH_ROW, "smollm2")
        model_row(d, "smollm2").find_element(By.CSS_SELECTOR, 'button[data-action="load"]').click()
        wait_until(d, lambda d: row_state(d, "smollm2") == "ready", "ready again after Load")
        seen = d.execute_script("return window.__seen")
        assert any(s["state"] == "loading" and s["progress"] for s in seen), seen
        pid2 = svc.model("smollm2")["pid"]
        assert pid2 != pid and _alive(pid2)

        # A crash: SIGKILL the child; the row counts a restart and the timeline shows crash + restart.
        os.kill(pid2, signal.SIGKILL)
        wait_until(d, lambda d: cell(d, "smollm2", "Restarts") == "1", "the restart in the row")
        wait_until(d, lambda d: row_state(d, "smollm2") == "ready", "ready after the restart")
        events = d.find_element(By.ID, "events")
        wait_until(
            d,
            lambda d: events.find_elements(By.CSS_SELECTOR, 'li[data-kind="crash"][data-model="smollm2"]'),
            "a crash event",
        )
        assert events.find_elements(By.CSS_SELECTOR, 'li[data-kind="restart"][data-model="smollm2"]')
        assert "SIGKILL" in events.text
        pid3 = svc.model("smollm2")["pid"]
        wait_until(d, lambda d: cell(d, "smollm2", "PID · port").startswith(str(pid3)), "the new pid")

        assert severe_console_errors(d) == []


def test_status_page_asks_for_the_api_key(tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path) -> None:
    key = "page-test-key-0123456789"
    cfg = _config(tmp_path, tiny_gguf, "tiny")
    # Discovery reads a recorded machine (a 7800 XT and a 780M iGPU): the Devices panel shows a GPU
    # bar and the skipped iGPU with its reason. The model itself runs on the CPU.
    env = _recorded_machine_env(key)
    with (
        running_service(cfg, tmp_path / "state", llama_server_bin, api_key=key, extra_env=env) as svc,
        chromium(tmp_path / "profile", 390, 844) as d,
    ):
        assert httpx.get(f"{svc.url}/api/models").status_code == 401
        d.get(svc.url + "/")
        login = d.find_element(By.ID, "login")
        wait_until(d, lambda d: login.is_displayed(), "the login form")
        assert not d.find_element(By.ID, "app").is_displayed()
        assert d.find_elements(By.CSS_SELECTOR, "tbody.model") == []
        assert "tiny" not in d.find_element(By.TAG_NAME, "body").text

        field = d.find_element(By.ID, "login-key")
        field.send_keys("wrong-key", Keys.ENTER)
        wait_until(d, lambda d: "refused" in d.find_element(By.ID, "login-error").text, "the refusal")
        assert d.find_elements(By.CSS_SELECTOR, "tbody.model") == []

        field.send_keys(key, Keys.ENTER)
        wait_until(d, lambda d: row_state(d, "tiny") == "ready", "the row after the key")
        assert d.execute_script("return sessionStorage.getItem('forge.apiKey')") == key
        assert d.get_cookies() == []
        assert key not in d.current_url

        devices = d.find_element(By.ID, "devices")
        wait_until(d, lambda d: "780M" in devices.text, "the GPUs in the Devices panel")
        assert d.find_elements(By.CSS_SELECTOR, 'li[data-device="amd:0"] .bar')
        igpu = devices.find_element(By.CSS_SELECTOR, 'li[data-device="amd:1"]')
        assert "iGPU" in igpu.text and "skipped: integrated GPU" in igpu.text, igpu.text
        assert not igpu.find_elements(By.CSS_SELECTOR, ".bar")

        # State changes work with the key (Bearer header; same-origin Origin is accepted)…
        model_row(d, "tiny").find_element(By.CSS_SELECTOR, 'button[data-action="unload"]').click()
        wait_until(d, lambda d: row_state(d, "tiny") == "stopped", "stopped after Unload")
        # …and a foreign page's request with the key is still refused by the Origin check.
        r = httpx.post(
            f"{svc.url}/api/models/tiny/load", headers={**svc.headers, "Origin": "http://evil.example"}
        )
        assert r.status_code == 403
        # The page opened at a LAN name (same origin) may act: the key guards against rebinding.
        port = svc.url.rsplit(":", 1)[1]
        lan = {**svc.headers, "Host": f"gpubox.lan:{port}", "Origin": f"http://gpubox.lan:{port}"}
        assert httpx.post(f"{svc.url}/api/models/tiny/load", headers=lan, timeout=60).status_code == 200
        wait_until(d, lambda d: row_state(d, "tiny") == "ready", "ready after the LAN-origin load")

        full_page_screenshot(d, tmp_path / "status-phone-key.png", 390)
        d.find_element(By.ID, "logout").click()
        wait_until(d, lambda d: login.is_displayed(), "the login form after Forget key")
        assert d.find_elements(By.CSS_SELECTOR, "tbody.model") == []
        assert severe_console_errors(d, allow=("401",)) == []


# Every control (button, field, the log toggle) that is shown, with what keeps it from being used
# without scrolling sideways: outside the viewport, or cut by a box that scrolls or clips.
_UNREACHABLE = """
const vw = document.documentElement.clientWidth;
const out = [];
const name = (el) => `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}` +
  `${el.dataset.action ? "[" + el.dataset.action + "]" : ""} "${(el.textContent || el.value || "").trim().slice(0, 20)}"` +
  `${el.closest("tbody.model") ? " of " + el.closest("tbody.model").dataset.model : ""}`;
if (document.documentElement.scrollWidth > vw + 1) {
  out.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${vw} px window`);
}
for (const el of document.querySelectorAll("button, input, select, textarea, summary")) {
  const r = el.getBoundingClientRect();
  if (!el.getClientRects().length || r.width === 0) continue;  // not shown
  if (r.left < -0.5 || r.right > vw + 0.5) out.push(`${name(el)} spans ${Math.round(r.left)}..${Math.round(r.right)} of ${vw}`);
  for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
    const cs = getComputedStyle(p);
    if (cs.overflowX === "visible") continue;
    if (p.scrollWidth > p.clientWidth + 1) out.push(`${name(el)} is inside ${p.className || p.tagName}, which scrolls sideways`);
    const pr = p.getBoundingClientRect();
    if (r.left < pr.left - 0.5 || r.right > pr.right + 0.5) out.push(`${name(el)} is cut by ${p.className || p.tagName}`);
  }
}
return [...new Set(out)];
"""

LONG_NAME = "a-model-with-a-rather-long-descriptive-name-for-the-table-q4"


def test_every_control_is_reachable_from_390_px_up(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    """At common laptop widths the models table was ~1330 px wide: it scrolled sideways, "Unload"
    was cut at "Un" and "Reload" was off-screen. Every control must be usable without scrolling
    sideways at every width from a phone's up; checked in the browser, row by row, with a ready
    model (a long name, a TTL, GPU and CPU memory lines), a failed one, and the header's buttons."""
    key = "page-width-key-0123456789"
    cfg = _config(tmp_path, tiny_gguf, LONG_NAME, ttl=900, parallel=4)
    with cfg.open("a") as f:
        f.write(
            f'[models.broken]\npath = "{tiny_gguf}"\ngpu = "cpu"\npreload = true\nargs = ["--no-such-flag"]\n'
        )
    env = _recorded_machine_env(key)
    with (
        running_service(cfg, tmp_path / "state", llama_server_bin, api_key=key, extra_env=env) as svc,
        chromium(tmp_path / "profile", 1366, 900) as d,
    ):
        d.get(svc.url + "/")
        d.execute_script("sessionStorage.setItem('forge.apiKey', arguments[0])", key)
        d.refresh()
        wait_until(d, lambda d: row_state(d, LONG_NAME) == "ready", "the ready row")
        wait_until(d, lambda d: row_state(d, "broken") == "failed", "the failed row")
        wait_until(d, lambda d: d.find_element(By.ID, "logout").is_displayed(), "the header's buttons")
        for width in (1920, 1440, 1401, 1400, 1366, 1280, 1024, 961, 960, 820, 390):
            full_page_screenshot(d, tmp_path / f"status-{width}.png", width)
            problems = d.execute_script(_UNREACHABLE)
            assert problems == [], f"at {width} px: {problems} (see {tmp_path}/status-{width}.png)"
            for action in ("load", "unload", "reload"):
                button = model_row(d, LONG_NAME).find_element(
                    By.CSS_SELECTOR, f'button[data-action="{action}"]'
                )
                assert button.text == action.capitalize(), (width, button.text)
        # The check can fail: a fixed-width box wider than the window is reported.
        d.execute_script("document.querySelector('.table-wrap').style.minWidth = '2000px'")
        assert d.execute_script(_UNREACHABLE), "a 2000 px table at 390 px was not reported"
