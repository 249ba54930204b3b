#!/usr/bin/env bash
# The README's test command: set up (idempotently), then run the whole suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
