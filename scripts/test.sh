#!/usr/bin/env bash
# `make test`: the whole suite in three lanes at once (tests/conftest.py sorts them):
#   serial    root tests that build emulated networks and time packets, one at a time;
#   root      root tests that build networks but time nothing, one at a time beside them,
#             at nice 5 with their network elements not in the real-time class;
#   parallel  the rest, on TEST_JOBS pytest-xdist workers at nice 10, so that on a 2-core
#             machine the emulations get the CPU first.
# Each line is prefixed with its lane, and each lane ends with its slowest tests (where the
# time goes); every lane's exit status counts, and the last lines recap each lane's exit
# status and failed tests. Extra arguments
# go to every pytest run.
#   bash scripts/test.sh [PYTEST ARGS...]      (VENV=.venv TEST_JOBS=2)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY="${VENV:-.venv}/bin/python"
JOBS="${TEST_JOBS:-2}"
t0=$(date +%s)
# Named namespaces before the lanes, and each test's window: tests/leaks.py names what
# the session left behind and the tests running when it was made.
leakdir=$(mktemp -d)
trap 'rm -rf "$leakdir"' EXIT
ls -1 /run/netns 2>/dev/null > "$leakdir/before"
state_root=$("$PY" -c 'from testbed.emu.state import state_root; print(state_root())')
ls -1 "$state_root" 2>/dev/null > "$leakdir/state-before"
export LIGHTPIPE_TEST_WINDOWS="$leakdir/windows"
# Bytecode is cached (__pycache__, ignored by git) even where the shell sets
# PYTHONDONTWRITEBYTECODE, as these machines' shells do: otherwise each of the five pytest
# processes rewrites every test module's asserts again (collection 21 s of CPU instead of 9),
# and each of the suite's thousands of Python processes (CLI runs, forwarders, controllers,
# workers) compiles LightPipe's modules again (docs/testing.md "Where the time goes").
unset PYTHONDONTWRITEBYTECODE
# A test after which the kernel's SIGINT/SIGTERM disposition no longer matches Python's
# handler fails (tests/conftest.py); LIGHTPIPE_TEST_STRICT_SIGNALS=0 makes it a warning.
export LIGHTPIPE_TEST_STRICT_SIGNALS="${LIGHTPIPE_TEST_STRICT_SIGNALS:-1}"
lane() {  # lane NAME PYTEST-ARGS...: run pytest, prefix its lines, keep its exit status
  local name="$1"
  shift
  set +e
  LIGHTPIPE_TEST_LANE="$name" "$@" 2>&1 | tee "$leakdir/$name.log" | sed -u "s/^/[$name] /"
  local rc="${PIPESTATUS[0]}"
  echo "[$name] exit $rc after $(( $(date +%s) - t0 )) s"
  echo "$rc" > "$leakdir/$name.rc"
  return "$rc"
}
# No lane runs an auto-factor run again (LIGHTPIPE_TIME_FACTOR_RERUNS=0): a run that
# the suite's own load makes unfaithful would double its load beside the measured tests;
# the rule is tested on given verdicts (tests/test_timefactor.py).
export LIGHTPIPE_TIME_FACTOR_RERUNS=0
# The serial lane's SDN controllers stay at its nice 0 (LIGHTPIPE_CONTROL_PRIORITY), as
# they were before the controller's own priority: at nice -10 they would take more of
# the CPU from the root lane's networks beside it.
LIGHTPIPE_CONTROL_PRIORITY=inherit lane serial "$PY" -m pytest tests -m serial \
  -p no:cacheprovider --durations=12 "$@" &
serial=$!
# The root lane's networks time nothing: at nice 5, their forwarders and switches left
# there (LIGHTPIPE_EMU_PRIORITY=inherit, not SCHED_RR), so they cannot take the CPU from
# the serial lane's measured ones (two packet-timing reds of 2026-11-29 under that load).
LIGHTPIPE_EMU_PRIORITY=inherit lane root nice -n 5 "$PY" -m pytest tests -m rootlane \
  -p no:cacheprovider --durations=8 "$@" &
rootlane=$!
# --dist load in chunks of 2, the `cost`-marked tests first (tests/conftest.py): the longest
# start first, each worker takes the next test when it is free.
lane parallel nice -n 10 "$PY" -m pytest tests -m "not serial and not rootlane" -n "$JOBS" \
  --dist load --maxschedchunk 2 -p no:cacheprovider --durations=12 "$@" &
parallel=$!
rc=0
wait "$serial" || rc=1
wait "$rootlane" || rc=1
wait "$parallel" || rc=1
"$PY" -m tests.leaks "$leakdir/before" "$leakdir/windows" \
  --state-before "$leakdir/state-before" || rc=1
# The recap, last, because a CI log is often read from its tail only: each lane's exit
# status and the tests it failed (pytest's -ra summary lines).
for name in serial root parallel; do
  echo "test: $name lane exit $(cat "$leakdir/$name.rc" 2>/dev/null || echo '?')"
  grep -E '^(FAILED|ERROR) ' "$leakdir/$name.log" 2>/dev/null | cut -c1-300 | sed "s/^/test:   /"
done
echo "test: all lanes done in $(( $(date +%s) - t0 )) s: $([ "$rc" = 0 ] && echo passed || echo FAILED)"
exit "$rc"
