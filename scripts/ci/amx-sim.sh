#!/usr/bin/env bash
# Run a command as if this machine's CPU were an Intel Xeon with AMX at the pinned llama.cpp, so
# the real-binary tests exercise what every AMX machine runs (children with --no-repack, and the
# memory estimate of unrepacked weights) on any CPU.
#
# It makes a copy of forge's build cache whose llama-server dies of SIGILL on repacked weight
# types unless --no-repack is passed (amx_sim_wrapper.py, which otherwise execs the real binary),
# and whose build-info.json records --no-repack as the self-test's child flag, as the real
# self-test records it on such a CPU. Models and sources are linked, not copied; the real cache is
# not touched. On a CPU that really has AMX the simulation changes nothing the tests can see.
#   usage: scripts/ci/amx-sim.sh .venv/bin/pytest tests/models     (from the project's root)
set -euo pipefail
src="${XDG_CACHE_HOME:-$HOME/.cache}/rocmforge"
sim="${AMX_SIM_DIR:-${TMPDIR:-/tmp}/amx-sim}"
[ -d "$src/builds" ] || { echo "amx-sim: no $src/builds: run make setup first" >&2; exit 2; }
mkdir -p "$sim/rocmforge"
for d in "$src"/*; do
  n=$(basename "$d")
  [ "$n" = builds ] || [ "$n" = selftest ] || ln -sfn "$d" "$sim/rocmforge/$n"
done
rm -rf "$sim/rocmforge/builds" "$sim/rocmforge/selftest"
cp -a "$src/builds" "$sim/rocmforge/builds"
here="$(cd "$(dirname "$0")" && pwd)"
wrapped=0
for b in "$sim"/rocmforge/builds/*/; do
  [ -f "$b/bin/llama-server" ] && [ -f "$b/build-info.json" ] || continue
  mkdir -p "$b/bin/.real"
  mv "$b/bin/llama-server" "$b/bin/.real/llama-server"
  cp "$here/amx_sim_wrapper.py" "$b/bin/llama-server"
  chmod +x "$b/bin/llama-server"
  python3 - "$b/build-info.json" <<'PY'
import json, sys
p = sys.argv[1]; d = json.load(open(p))
flags = ["--no-repack"]
d["child_args"] = flags
if isinstance(d.get("selftest"), dict):
    d["selftest"]["child_args"] = flags
    d["selftest"]["detail"] = "served 8 tokens with --no-repack (simulated AMX: the default flags died of SIGILL)"
json.dump(d, open(p, "w"), indent=2)
PY
  wrapped=$((wrapped + 1))
done
[ "$wrapped" -gt 0 ] || { echo "amx-sim: no llama-server build with a build-info.json in $src/builds" >&2; exit 2; }
echo "amx-sim: $wrapped build(s) at $sim (llama-server needs --no-repack for quantized weights)" >&2
XDG_CACHE_HOME="$sim" exec "$@"
