#!/usr/bin/env bash
# The main job, from a fresh Debian machine: builds LightStore and runs a
# short benchmark of the engine on the default data directory (data/lightstore).
# (Once the node server lands, this starts a node answering redis-cli.)
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
for w in s-set r-get r-mixed; do
  ./target/release/lightstore bench --workload "$w" --num "${NUM:-50000}" --path data/lightstore "$@"
done
