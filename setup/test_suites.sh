#!/usr/bin/env bash
# `make test` / `make test-fast`: the suite in .venv and, side by side with it, the suite on Oat's stack (.venv-oat).
#
#   setup/test_suites.sh VENV_MARKERS OAT_MARKERS     pytest -m expressions ("" for none)
#
# Why side by side: most tests run one busy process (one torch thread, one engine), so the two suites one after the
# other leave one of the two cores idle for most of an hour; together they take about the longer one's time
# (README.md#development). The suite on Oat's stack first builds .venv-oat where it is missing
# (`make setup-oat`); its output goes to a log (.venv-oat.log), printed here once the .venv suite is done and
# followed live until it ends. Where this machine cannot build Oat's stack, one line says why and that suite is
# skipped, except under CI (CI=true), which runs on machines that can and fails instead.
set -uo pipefail
cd "$(dirname "$0")/.."

venv_markers=${1-}
oat_markers=${2-}
VENV=${VENV:-.venv}
OAT_VENV=${OAT_VENV:-.venv-oat}
oat_log=$OAT_VENV.log
MAKE=${MAKE:-make}

oat_pid=
stop_oat_suite() {
  # pytest ignores a SIGINT it inherited as ignored, so the background suite runs in its own process group (set -m)
  # and gets Ctrl-C from here: its fixtures then stop the programs they started.
  if [ -n "$oat_pid" ] && kill -0 "$oat_pid" 2>/dev/null; then
    echo "stopping the suite on Oat's stack ($oat_log)" >&2
    kill -INT -- "-$oat_pid" 2>/dev/null
    wait "$oat_pid" 2>/dev/null
  fi
  exit 130
}
trap stop_oat_suite INT TERM HUP

if why=$(setup/oat_venv.sh --possible); then
  echo "the suite on Oat's stack ($OAT_VENV; built first where missing) runs beside this one; its log: $oat_log"
  set -m
  ( $MAKE --no-print-directory setup-oat && \
    "$OAT_VENV/bin/python" -m pytest ${oat_markers:+-m "$oat_markers"} ) > "$oat_log" 2>&1 < /dev/null &
  oat_pid=$!
  set +m
else
  echo "note: skipping the suite on Oat's stack ($OAT_VENV): $why"
  if [ "${CI:-}" = "true" ]; then echo "CI must run it: failing" >&2; exit 1; fi
fi

# CI first installs the peers (TRL, `make setup-peers`) and requires them; elsewhere their test skips with a note.
if [ "${CI:-}" = "true" ]; then
  $MAKE --no-print-directory setup-peers && \
    OAT_DPPO_REQUIRE_PEERS=1 "$VENV/bin/python" -m pytest ${venv_markers:+-m "$venv_markers"}
else
  "$VENV/bin/python" -m pytest ${venv_markers:+-m "$venv_markers"}
fi
venv_status=$?

oat_status=0
if [ -n "$oat_pid" ]; then
  echo
  echo "===== the suite on Oat's stack ($oat_log; it started beside the one above) ====="
  tail -n +1 -f --pid="$oat_pid" "$oat_log"
  wait "$oat_pid"
  oat_status=$?
fi

echo "suites: $VENV exit status $venv_status${oat_pid:+, $OAT_VENV exit status $oat_status}"
[ "$venv_status" -eq 0 ] && [ "$oat_status" -eq 0 ]
