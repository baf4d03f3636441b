#!/usr/bin/env bash
# The client install from a fresh virtualenv: `pip install <checkout>` (no extra) must bring no
# server, database or numeric package, and its `corral ls`, `submit`, `describe` and `logs -f`
# must work against a manager started from the full environment (the README's, with
# corral[server]). Prints what pip installed, then each command and its output.
#
# Run from anywhere: scripts/fresh_client_install.sh [CLIENT_VENV] [FULL_PYTHON]
#   CLIENT_VENV  where to create the client's virtualenv (default: a new temporary directory)
#   FULL_PYTHON  the interpreter that runs `corral up` (default: the checkout's .venv/bin/python)
set -euo pipefail
checkout="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d /tmp/corral-fresh-client.XXXXXX)"
venv="${1:-$work/client}"
full="${2:-$checkout/.venv/bin/python}"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill -INT "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "== python3 -m venv $venv && CORRAL_COMPILE=0 $venv/bin/pip install $checkout"
python3 -m venv "$venv"
# the README's client install from a checkout: the core, which the client never runs, uncompiled
CORRAL_COMPILE=0 "$venv/bin/pip" install -q -c "$checkout/constraints.txt" "$checkout" 2>&1 | grep -v '^WARNING: Location' || true
echo "== installed ($venv/bin/pip list)"
"$venv/bin/pip" list --format=freeze 2>/dev/null | grep -v '^WARNING' | tr '\n' ' '
echo
bad=$("$venv/bin/pip" list --format=freeze 2>/dev/null | cut -d= -f1 | tr 'A-Z_' 'a-z-' |
    grep -xE 'fastapi|starlette|sqlalchemy|alembic|uvicorn|numpy|scipy|matplotlib|sortedcontainers|typer|rich|prometheus-client|nvidia-ml-py|psycopg|ray|torch' || true)
if [ -n "$bad" ]; then
    echo "FAIL: the client install brought: $bad" >&2
    exit 1
fi
echo "OK: none of fastapi, starlette, sqlalchemy, alembic, uvicorn, numpy, scipy, matplotlib, typer, rich, ..."
echo "== $(du -sh "$venv" | cut -f1) in $venv"

# The manager, from the full environment, on a free port of 127.0.0.1.
port=$("$full" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$full" -m corral.cli up --gpus 2 --single-user --data-dir "$work/state" --port "$port" \
    > "$work/up.log" 2>&1 &
server_pid=$!
export CORRAL_URL="http://127.0.0.1:$port"
for _ in $(seq 1800); do
    if [ -s "$work/state/admin.token" ] && CORRAL_TOKEN="$(cat "$work/state/admin.token")" "$venv/bin/corral" ls >/dev/null 2>&1; then
        break
    fi
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/up.log" >&2; exit 1; }
    sleep 0.1
done
CORRAL_TOKEN="$(cat "$work/state/admin.token")"
export CORRAL_TOKEN

# Run from an empty directory: the checkout's sources are not on the path, only the install.
cd "$work"
run() { echo "\$ $*"; "$@"; }
echo "== the client venv's corral against the manager at $CORRAL_URL"
run "$venv/bin/python" -c 'import corral, corral.progress, corral.client; print("corral from", corral.__file__)'
cat > job.yaml <<EOF
name: fresh-client
gpus: 1
command: ["$full", "-c", "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.5)"]
EOF
echo "\$ $venv/bin/corral submit job.yaml"
job=$("$venv/bin/corral" submit job.yaml)
echo "$job"
run "$venv/bin/corral" submit --gpus 1 --name second -- "$full" -c 'print("second job")'
run "$venv/bin/corral" ls
run "$venv/bin/corral" logs -f "$job"
run "$venv/bin/corral" describe "$job" | head -8
modules=$("$venv/bin/python" -c '
import sys
from corral.cli.main import app
sys.argv = ["corral", "ls"]
try:
    app()
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("fastapi", "starlette", "sqlalchemy", "alembic", "uvicorn", "numpy") or m.startswith(("corral.core", "corral.server")))
print(" ".join(heavy))' 2>/dev/null | tail -1)
[ -z "$modules" ] || { echo "FAIL: corral ls imported: $modules" >&2; exit 1; }
echo "OK: corral ls imported none of the manager's modules"
echo "== the manager's and the simulator's commands name the extra they need"
for command in "up --gpus 4 --demo" "simulate --trace synthetic:jobs=5 --cluster 1x8"; do
    echo "\$ $venv/bin/corral $command"
    # shellcheck disable=SC2086  # the words of the command
    if "$venv/bin/corral" $command; then echo "FAIL: it ran" >&2; exit 1; else echo "(exit $?)"; fi
done
