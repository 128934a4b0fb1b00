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
