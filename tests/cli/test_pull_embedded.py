"""``forge pull NAME`` fetches an embedded model (what ``make model`` runs for the model
``examples/forge.toml`` serves), and Ctrl-C during a pull is one line and exit 130, not a
KeyboardInterrupt traceback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from rocmforge_supervisor.models import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parents[2]
FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]

#: ``forge pull`` whose fetch blocks (a download that takes a while), for the interrupt.
_SLOW_PULL = """
import sys, time
import rocmforge_supervisor.models as models
def slow(name, settings):
    print("fetching", flush=True)
    time.sleep(60)
models.ensure_embedded = slow
sys.argv = ["forge", "pull", sys.argv[1]]
from rocmforge_supervisor.cli.main import main
main()
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"), COLUMNS="250", NO_COLOR="1")


def test_ctrl_c_during_a_pull_is_one_line_and_130(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _SLOW_PULL, DEFAULT_MODEL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
    ) as p:
        assert p.stdout is not None and p.stdout.readline() == "fetching\n"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    (line,) = err.strip().splitlines()
    assert line.startswith("forge pull: interrupted"), line


def test_pull_names_an_embedded_model_or_says_did_you_mean(tmp_path: Path, smollm2_path: Path) -> None:
    env = _env(tmp_path)  # the model cache is the default one, where the fixture fetched it
    r = subprocess.run([*FORGE, "pull", DEFAULT_MODEL], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(smollm2_path), r.stdout
    assert f'path = "{DEFAULT_MODEL}"' in r.stderr, r.stderr

    r = subprocess.run([*FORGE, "pull", "smolm2-135m"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "did you mean 'smollm2-135m'?" in line and "org/repo" in line, line


def test_make_model_runs_forge_pull() -> None:
    """The Makefile's model step is a forge command (its Ctrl-C handled), not a bare python -c."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^model:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe is not None, "no model target"
    assert "python -c" not in recipe.group(1) and f"pull {DEFAULT_MODEL}" in recipe.group(1), recipe.group(1)
