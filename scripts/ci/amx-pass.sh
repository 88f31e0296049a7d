#!/usr/bin/env bash
# The real-binary tests a second time as on an Intel Xeon with AMX (scripts/ci/amx-sim.sh): every
# child needs --no-repack there, and the estimate of unrepacked weights is what placement uses.
# Run by .ci/run after `make test`, so a machine without AMX cannot let this regress.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec scripts/ci/amx-sim.sh .venv/bin/pytest -q -o addopts="-p no:cacheprovider --strict-markers" \
  tests/models/test_estimate_real.py \
  tests/binaries/test_selftest.py \
  tests/process/test_instance.py \
  tests/client/test_tiny_gguf.py \
  tests/gateway/test_kv_unified_real.py \
  tests/gateway/test_speculative_real.py \
  tests/supervisor/test_cpu_faults.py \
  "$@"
