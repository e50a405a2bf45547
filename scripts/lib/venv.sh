# Sourced by scripts/*: make .venv with the project and its dev extras installed.
# Reinstalls only when pyproject.toml changed since the last install.
VENV="${BINDERY_VENV:-$PWD/.venv}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
  echo "== creating $VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade pip
fi
stamp="$VENV/.bindery-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "== installing kube-bindery[dev] into $VENV"
  "$PY" -m pip install --quiet -e '.[dev]'
  touch "$stamp"
fi
