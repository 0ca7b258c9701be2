#!/usr/bin/env bash
# Download, here, the wheels that the GPU machine lacks (its image has torch, pytest, xdist,
# matplotlib, pandas, numpy but no Jupyter stack) for its Python 3.12, at the versions this
# checkout's .venv holds, into .whl/ (git-ignored through .git/info/exclude). Then run
# .ci/gpu/check.sh there with .whl carried (see the README's "GPU tests").
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .git/info .whl
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
names="asttokens comm debugpy decorator executing fastjsonschema ipykernel ipython
ipython-pygments-lexers ipywidgets jedi jsonschema jsonschema-specifications jupyter-client
jupyter-core jupyterlab-widgets jupytext matplotlib-inline mdit-py-plugins nbclient nbformat
nbval nest-asyncio2 parso pexpect platformdirs prompt-toolkit ptyprocess pure-eval pyzmq
referencing rpds-py stack-data tornado traitlets wcwidth widgetsnbextension"
have=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | tr 'A-Z_' 'a-z-')
specs=""
for n in $names; do
  v=$(printf '%s\n' "$have" | grep "^$n==" | cut -d= -f3 || true)
  specs="$specs $n${v:+==$v}"
done
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64; do platforms="$platforms --platform $p"; done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp $platforms -d .whl $specs
ls .whl | wc -l
