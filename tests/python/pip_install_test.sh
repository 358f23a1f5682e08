#!/bin/sh
# `pip install .` end to end: the wheel built by scikit-build-core (pyproject.toml) from the
# project's .venv (which has the backend; no network), installed into a fresh virtual
# environment, imported from another directory, its CLI run. The wheel's CMake build directory
# sits in the build tree, and the compiler cache the main build filled makes it cheap (the
# differing -D and -I flags hit in ccache's preprocessor mode); the
# wheel is built without the CUDA backend here (nvcc's objects are not cached: with it the
# first build takes ~8 minutes on 2 cores), which a user's `pip install .` builds when nvcc is
# there.
#   pip_install_test.sh SOURCE_DIR BUILD_DIR
set -eu
root=$1
build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The main build's compiler by the same name: scikit-build-core otherwise sets CXX to Python's
# (x86_64-linux-gnu-g++), which ccache tells apart from c++, so nothing hit the cache and the
# wheel compiled everything again (past this test's 15 minutes on a 2-core AVX2 machine).
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
CXX=${cxx:-c++} CMAKE_GENERATOR="Unix Makefiles" "$root/.venv/bin/python3" -m pip wheel --no-build-isolation --no-deps -q \
  --disable-pip-version-check -w "$tmp/wheels" --config-settings=build-dir="$build/wheel-cpu" \
  --config-settings=cmake.define.MESHTRAIN_CUDA=OFF "$root"
ls "$tmp"/wheels
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/pip" install --no-deps -q --disable-pip-version-check "$tmp"/wheels/meshtrain-*.whl
cd "$tmp"
"$tmp/venv/bin/python3" - <<'PY'
import os, numpy as np, meshtrain as mt
assert "site-packages" in mt.__file__, mt.__file__
x = mt.array(np.arange(6, dtype=np.float32).reshape(2, 3))
v, g = mt.value_and_grad(lambda p: mt.sum(mt.square(p["x"])))({"x": x})
assert v.item() == 55.0 and np.array_equal(np.asarray(g["x"]), 2 * np.asarray(x))
print("import meshtrain from", os.path.dirname(mt.__file__), "ok")
PY
"$tmp/venv/bin/meshtrain" --help | head -3
