"""`forge load NAME` and `forge ps` against a running service with residency rules (real
subprocesses; the children are the FAKE llama-server): a load a rule refuses is one line naming
the rule and the fix, exit 2, and `forge ps` shows each model's rules."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.service import FORGE, Service, running_service, wait_for, write_config


def _forge(svc: Service, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir), COLUMNS="250", NO_COLOR="1")
    return subprocess.run(
        [*FORGE, *args, "--config", str(svc.config)], capture_output=True, text=True, env=env, timeout=120
    )


def test_a_refused_load_is_one_line_and_exit_2_and_ps_shows_the_rules(
    tmp_path: Path, tiny_gguf: Path, fake_bin: Path
) -> None:
    config = write_config(
        tmp_path / "forge.toml",
        f'[models.big]\npath = "{tiny_gguf}"\npinned = true\npreload = true\n'
        f'[models.small]\npath = "{tiny_gguf}"\nevict_cost = 3\n'
        '[groups.gpu]\nmembers = ["big", "small"]\nmax_loaded = 1\n',
    )
    with running_service(config, tmp_path / "state", fake_bin) as svc:
        wait_for(lambda: svc.model("big").get("pid"), timeout=30, what="big loaded")
        r = _forge(svc, "load", "small")
        assert r.returncode == 2, (r.stdout, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, r.stderr
        assert "max_loaded = 1" in lines[0] and "big (pinned)" in lines[0] and "forge unload" in lines[0]
        ps = _forge(svc, "ps")
        assert ps.returncode == 0, ps.stderr
        big = next(line for line in ps.stdout.splitlines() if " big " in line)
        small = next(line for line in ps.stdout.splitlines() if " small " in line)
        assert "pinned, group gpu" in big and "group gpu, cost 3" in small, ps.stdout


def test_ps_shows_the_conversation_tier(tmp_path: Path, tiny_gguf: Path, fake_bin: Path) -> None:
    config = write_config(
        tmp_path / "forge.toml",
        f'[models.m]\npath = "{tiny_gguf}"\npreload = true\nkeep_context = true\nkeep_conversations = true\n'
        'args = ["--fake-slots", "--fake-prompt-tokens", "600"]\n',
    )
    with running_service(config, tmp_path / "state", fake_bin) as svc:
        wait_for(lambda: svc.model("m").get("pid"), timeout=30, what="m loaded")
        messages = [{"role": "user", "content": "first"}]
        with svc.client() as c:
            for question in ("second", "third"):
                r = c.post("/v1/chat/completions", json={"model": "m", "messages": messages}, timeout=30)
                assert r.status_code == 200, r.text
                reply = r.json()["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": question}]
        ps = _forge(svc, "ps")
        assert ps.returncode == 0, ps.stderr
        row = next(line for line in ps.stdout.splitlines() if " m " in line)
        assert "1 found, 0 restored" in row, ps.stdout
