"""``[server] watch_config`` on a real ``forge serve``: the config follows its files. A ``conf.d``
file added, a ConfigMap-style symlink swap of the main file, an invalid edit (``config_rejected``;
the old config keeps serving) and a ``conf.d`` file removed — each applied within 5 s of the write,
and the model no change touched keeps its child (the same pid). The children are the FAKE
llama-server (``FORGE_LLAMA_SERVER``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.support.service import Service, running_service, wait_for

MAIN = """[server]
api_key = "k"
watch_config = true
[supervisor]
drain_timeout = 2
stop_timeout = 5
[models.a]
path = "{path}"
preload = true
ttl = {ttl}
"""


def _events(svc: Service, kind: str, want: int) -> list[dict[str, Any]]:
    """The first ``want`` events of ``kind`` in the history (a read timeout fails the test)."""
    out: list[dict[str, Any]] = []
    with svc.client() as c, c.stream("GET", "/api/events?replay=1", timeout=10) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and (ev := json.loads(line[len("data: ") :]))["kind"] == kind:
                out.append(ev)
                if len(out) == want:
                    return out
    raise AssertionError(f"the event stream ended after {out}")


def _swap(root: Path, version: str, text: str) -> None:
    """What kubelet does to a ConfigMap volume: a new directory, then ``..data`` swapped to it."""
    folder = root / f"..{version}"
    folder.mkdir()
    (folder / "forge.toml").write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(folder.name)
    tmp.rename(root / "..data")


def test_the_config_follows_its_files_and_unchanged_children_stay(
    tmp_path: Path, tiny_gguf: Path, fake_bin: Path
) -> None:
    root = tmp_path / "etc"
    root.mkdir()
    _swap(root, "v1", MAIN.format(path=tiny_gguf, ttl=0))
    config = root / "forge.toml"
    config.symlink_to("..data/forge.toml")
    conf_d = root / "conf.d"
    conf_d.mkdir()
    with running_service(config, tmp_path / "state", fake_bin, api_key="k") as svc:
        wait_for(lambda: svc.model("a").get("pid"), timeout=30, what="a loaded")
        pid = svc.model("a")["pid"]

        # A conf.d file added: model b appears.
        written = time.monotonic()
        (conf_d / "10-b.toml").write_text(f'[models.b]\npath = "{tiny_gguf}"\n')
        wait_for(lambda: "b" in svc.models(), timeout=5, what="b added")
        assert time.monotonic() - written < 5.0

        # The main file swapped (a ConfigMap update): a's ttl changes in place.
        written = time.monotonic()
        _swap(root, "v2", MAIN.format(path=tiny_gguf, ttl=600))
        wait_for(lambda: svc.model("a").get("ttl") == 600, timeout=5, what="a's new ttl")
        assert time.monotonic() - written < 5.0

        # An invalid edit: rejected with an event, and the running config keeps serving.
        bad = conf_d / ".20-bad.toml.tmp"
        bad.write_text("[models.c]\nctx_size = 12\n")  # no path
        bad.rename(conf_d / "20-bad.toml")
        (event,) = _events(svc, "config_rejected", 1)
        assert "models.c.path" in event["data"]["error"] and "20-bad.toml" in event["data"]["error"]
        assert set(svc.models()) == {"a", "b"}
        with svc.client() as c:
            r = c.post("/v1/completions", json={"model": "a", "prompt": "Hi", "max_tokens": 2})
            assert r.status_code == 200, r.text

        # The bad file and b's file removed: b goes, a stays.
        (conf_d / "20-bad.toml").unlink()
        (conf_d / "10-b.toml").unlink()
        wait_for(lambda: "b" not in svc.models(), timeout=5, what="b removed")
        assert svc.model("a")["pid"] == pid and svc.model("a")["state"] == "ready"
        assert "config files changed: reloading" in svc.stderr_text()
