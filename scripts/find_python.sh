#!/usr/bin/env bash
# Print the path of a Python interpreter of version X.Y (default 3.11): python X.Y on PATH,
# else one under pyenv's versions; exit 1, printing nothing, when there is none.
#   bash scripts/find_python.sh 3.12
set -euo pipefail
want="${1:-3.11}"
case "$want" in
  3.[0-9]|3.[0-9][0-9]) ;;
  *) echo "find_python: $want: give a version as 3.Y" >&2; exit 2 ;;
esac
is_version() {  # is_version PY: PY runs and is version $want
  [ -x "$1" ] && [ "$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ]
}
for py in "$(command -v "python$want" 2>/dev/null || true)" \
          "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want".*/bin/python"$want"; do
  if [ -n "$py" ] && is_version "$py"; then echo "$py"; exit 0; fi
done
exit 1
