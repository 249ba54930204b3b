#!/usr/bin/env bash
# The README's serve command: set up (idempotently), then serve the default model (or the
# MODEL and flags given) on 127.0.0.1:8000.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/trio-llm" serve "$@"
