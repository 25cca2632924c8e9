#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: installs what it needs,
# then checks formatting and lints and runs every test (unit, model, crash,
# corruption, full-device, GC, and the end-to-end `lightstore bench` test).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
need_apt=()
command -v cc >/dev/null || need_apt+=(build-essential)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
if ! command -v cargo >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  need_apt+=(cargo rustc rustfmt rust-clippy)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}"
fi
export PATH="$HOME/.cargo/bin:$PATH"
rustup component add rustfmt clippy >/dev/null 2>&1 || true

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
