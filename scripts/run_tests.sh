#!/usr/bin/env bash
# Run the test suite. Failures exit non-zero; pytest's "no tests collected" (exit 5) is reported, not failed,
# so that a filter selecting nothing (e.g. PYTEST_ARGS="-k gpu" on a CPU machine) is not an error.
set -uo pipefail
PY=${1:-.venv/bin/python}
shift || true
"$PY" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 0
fi
exit "$rc"
