#!/usr/bin/env bash
# Install the Debian packages sluice needs to build and test, when they are missing.
set -euo pipefail
PKGS=(build-essential cmake pkg-config clang libclang-rt-14-dev libpcre2-dev xz-utils
      libssl-dev zlib1g-dev liburing-dev libjansson-dev)
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
