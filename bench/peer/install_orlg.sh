#!/usr/bin/env bash
# Install the peer optical-rl-gym (carlosnatalino/optical-rl-gym) into its own venv,
# /var/tmp/orlg-venv, apart from LightPipe's .venv. Used by bench/bench_rmsa.py.
#
#   bench/peer/install_orlg.sh            # clone from GitHub
#   ORLG_SRC=/path/to/optical-rl-gym bench/peer/install_orlg.sh   # a local clone / git dir
#
# Pins: the optical-rl-gym commit below (April 2024, the newest), Python 3.9 as its README
# asks, gym 0.21.0 (its setup.py pin; its sdist needs setuptools 65.5.0 and pip 21),
# numpy 1.26.4 (gym 0.21 uses np.bool8), networkx 3.2.1, matplotlib 3.8.4. The venv is
# made afresh on every run.
set -euo pipefail
VENV=${ORLG_VENV:-/var/tmp/orlg-venv}
SRC=${ORLG_SRC:-https://github.com/carlosnatalino/optical-rl-gym}
COMMIT=${ORLG_COMMIT:-20b0be1e65a362592621eb488402ff23e62957bb}
CHECKOUT="$VENV/src/optical-rl-gym"

PY=${ORLG_PYTHON:-}
if [ -z "$PY" ]; then
    for cand in python3.9 "$HOME"/.pyenv/versions/3.9*/bin/python3.9; do
        if "$cand" --version >/dev/null 2>&1; then PY=$cand; break; fi
    done
fi
if [ -z "$PY" ] || ! "$PY" --version >/dev/null 2>&1; then
    echo "install_orlg: no working python3.9 (optical-rl-gym wants 3.9; set ORLG_PYTHON)" >&2
    exit 2
fi
if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
    echo "install_orlg: $VENV exists and is not a venv; not touching it" >&2
    exit 2
fi
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "pip==21.3.1" "setuptools==65.5.0" "wheel==0.38.4"
"$VENV/bin/python" -m pip install -q "numpy==1.26.4" "networkx==3.2.1" \
    "matplotlib==3.8.4" "cloudpickle==3.0.0"
# gym 0.21.0's setup.py has an extras spec new setuptools reject: build it with the pins
# above, and no dependency resolution (its two deps, numpy and cloudpickle, are in).
"$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps "gym==0.21.0"
mkdir -p "$VENV/src"
git clone -q "$SRC" "$CHECKOUT"
git -C "$CHECKOUT" -c advice.detachedHead=false checkout -q "$COMMIT"
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$CHECKOUT"
"$VENV/bin/python" -c "import optical_rl_gym, gym; print('optical-rl-gym', '$COMMIT', 'gym', gym.__version__)"
