#!/usr/bin/env bash
# The main job, from a fresh Debian machine: builds LightStore and starts a
# node in the foreground on the default data directory (data/lightstore),
# listening on 127.0.0.1:7379. Talk to it with any Redis client:
#   redis-cli -p 7379 set hello world
#   redis-cli -p 7379 get hello
# Ctrl-C stops it cleanly. Extra arguments go to `lightstore node`
# (e.g. --listen 0.0.0.0:7379 --requirepass SECRET, --durability sync).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if ! command -v cc >/dev/null; then
  $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q build-essential
fi
if ! command -v cargo >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q cargo rustc
fi
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -p lightstore
echo "starting lightstore node (data data/lightstore; it says where it listens, 127.0.0.1:7379 unless --listen)"
echo "talk to it with: redis-cli -p 7379 set hello world   (apt-get install redis-tools)"
exec ./target/release/lightstore node --data data/lightstore "$@"
