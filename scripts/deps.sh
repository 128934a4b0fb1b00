#!/usr/bin/env bash
# Install the Debian packages sluice needs to build and test, when they are missing.
set -euo pipefail
PKGS=(build-essential cmake pkg-config clang libclang-rt-14-dev libpcre2-dev xz-utils
      libssl-dev zlib1g-dev liburing-dev libjansson-dev libmicrohttpd-dev curl nodejs)
# npm (tests/server installs the openai client with it) is a package of its own on Debian, but
# bundled with other nodejs builds (NodeSource), where the Debian one would conflict
command -v npm >/dev/null 2>&1 || PKGS+=(npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}"
fi

# The CUDA backend is compiled whenever a CUDA compiler is found (CMake looks in PATH and
# /usr/local/cuda/bin); there is no GPU in CI, but the code must keep compiling. Without one,
# take Debian's toolkit (nvidia-cuda-toolkit, in the contrib/non-free components) when apt
# offers it; SLUICE_NO_CUDA=1 skips this.
if [ -z "${SLUICE_NO_CUDA:-}" ] && ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if apt-cache show nvidia-cuda-toolkit >/dev/null 2>&1; then
    echo "installing: nvidia-cuda-toolkit (compiles the CUDA backend)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nvidia-cuda-toolkit ||
      echo "deps: nvidia-cuda-toolkit did not install; the CUDA backend will not be built"
  else
    echo "deps: no CUDA compiler and no nvidia-cuda-toolkit package (enable contrib/non-free);" \
         "the CUDA backend will not be built"
  fi
fi
