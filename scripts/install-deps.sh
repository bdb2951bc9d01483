#!/usr/bin/env bash
# Installs kvx's build and test dependencies from Debian bookworm packages.
# Idempotent: when every package is already installed it does nothing (no apt-get update).
set -euo pipefail
PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libhwy-dev libxxhash-dev libpcre2-dev libzstd-dev liblapack-dev
  libcpp-httplib-dev
  libhiredis-dev redis-server
  clang libclang-rt-14-dev
)
missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node and npm for the OpenAI client tests (tests/openai_client), from Debian
# unless a node is already installed (e.g. NodeSource's, which bundles npm).
if ! command -v node >/dev/null 2>&1; then
  for p in nodejs npm; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages already installed"
else
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The official openai npm package, pinned by the committed package-lock.json;
# npm ci only when node_modules does not match it (idempotent).
client=tests/openai_client
cd "$(dirname "$0")/.."
if command -v npm >/dev/null 2>&1; then
  if [ ! -d "$client/node_modules/openai" ] || [ "$client/package-lock.json" -nt "$client/node_modules/.package-lock.json" ]; then
    echo "install-deps: npm ci in $client"
    (cd "$client" && npm ci --no-audit --no-fund --loglevel=error)
  else
    echo "install-deps: $client/node_modules is up to date"
  fi
else
  echo "install-deps: npm not found; the openai client tests will be skipped"
fi
