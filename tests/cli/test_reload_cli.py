"""`forge reload` and SIGHUP with a ``[server]`` setting that only a restart applies: the CLI's
summary and the service log name it (it used to be ignored without a word). A real `forge serve`
whose children are the FAKE llama-server (``FORGE_LLAMA_SERVER``): no model is loaded here."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.support.service import FORGE, running_service, wait_for, write_config

BEFORE = '[server]\nlog_format = "text"\n'
AFTER = '[server]\nlog_format = "json"\n'
MODEL = '[models.m]\npath = "{path}"\n'


def test_reload_and_sighup_name_what_needs_a_restart(tmp_path: Path, tiny_gguf: Path, fake_bin: Path) -> None:
    config = write_config(tmp_path / "forge.toml", BEFORE + MODEL.format(path=tiny_gguf))
    with running_service(config, tmp_path / "state", fake_bin) as svc:
        env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir))
        write_config(config, AFTER + MODEL.format(path=tiny_gguf))
        r = subprocess.run([*FORGE, "reload"], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == (
            "config reloaded: 0 changed, 0 added, 0 removed, 1 unchanged; "
            "server.log_format: applied at the next restart of forge serve"
        )
        svc.proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: (
                svc.stderr_text().count("server.log_format take effect only when forge serve restarts") == 2
            ),
            timeout=30,
            what="the SIGHUP reload's warning",
        )
