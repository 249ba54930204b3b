#!/usr/bin/env bash
# The README's test command: set up (idempotently, with the browser the chat page's test
# drives), then run the whole suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh" --with-browser
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
