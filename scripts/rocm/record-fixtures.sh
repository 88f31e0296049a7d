#!/usr/bin/env bash
# Records the outputs tests/binaries/test_rocm_debian.py replays, inside the sid root:
#   scripts/rocm/sid-root.sh install llama.cpp llama.cpp-tools libggml0-backend-hip amd-smi rocminfo
#   scripts/rocm/sid-root.sh run bash scripts/rocm/record-fixtures.sh
# (the forge venv must exist there: `scripts/rocm/sid-root.sh venv`, and a self-test must have
# written its tiny model: `forge build --print-path` once).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
F=tests/fixtures/rocm-debian
mkdir -p "$F"
printf '%s' "$(hipconfig --version)" >"$F/hipconfig--version.txt"
printf '%s' "$(hipconfig -R)" >"$F/hipconfig-R.txt"
printf '%s' "$(hipconfig -l)" >"$F/hipconfig-l.txt"
printf '%s' "$(hipconfig -P)" >"$F/hipconfig-P.txt"
(cd /usr && find lib/*-linux-gnu*/cmake -maxdepth 1 -mindepth 1 | sort) >"$F/cmake-packages.txt"
{ rocminfo 2>&1 && echo "exit 0"; } >"$F/rocminfo.txt" || echo "exit $?" >>"$F/rocminfo.txt"
ls /usr/lib/*-linux-gnu*/ggml/backends0/ >"$F/backends0.txt"
llama-server --version >"$F/llama-server--version.txt" 2>&1
llama-server --log-verbosity 4 --list-devices >"$F/llama-server--list-devices.stdout" 2>"$F/llama-server--list-devices.stderr"
PYTHONPATH=/usr/lib/python3/dist-packages python3 - >"$F/amdsmi_init-error.txt" 2>/dev/null <<'PY'
import amdsmi
try:
    amdsmi.amdsmi_init()
except Exception as e:
    print(type(e).__name__)
    print(str(e), end="")
else:
    amdsmi.amdsmi_shut_down()
    print("no error")
PY
dpkg-query -W hipcc libamdhip64-dev libhipblas-dev librocblas-dev rocm-cmake llama.cpp llama.cpp-tools \
    libggml0 libggml0-backend-hip amd-smi libamd-smi27 rocminfo cmake ninja-build g++ python3 >"$F/packages.txt"
# The start of Debian's llama-server on forge's self-test model, stopped by its own pid.
model=$(find /root/.cache/rocmforge/selftest -name "*.gguf" | sort | head -n1)
llama-server -m "$model" --host 127.0.0.1 --port 18181 -c 256 -np 1 --no-webui -lv 4 >"$F/llama-server-start.log" 2>&1 &
pid=$!
for _ in $(seq 60); do
    grep -q "listening on" "$F/llama-server-start.log" && break
    sleep 0.5
done
kill -INT "$pid"
wait "$pid" || true
echo "recorded into $F"
