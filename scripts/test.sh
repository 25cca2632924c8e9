#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: installs what it needs,
# then checks formatting and lints and runs every test (unit, model, crash,
# corruption, full-device, GC, the end-to-end `lightstore bench` test, the
# `lightstore node` tests with redis-cli, redis-benchmark and redis-py, the
# cluster tests, the NBD adapter with nbdinfo, qemu-io, qemu-img, nbdcopy,
# nbdsh, fio and ext4 on nbdfuse, the FUSE file adapter with tar, git,
# pjdfstest, fsx, dbench, stress-ng, fio, rsync and SQLite), then the YCSB binding's tests and the real YCSB client
# running Load and A-F against a local 3-node cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
need_apt=()
command -v cc >/dev/null || need_apt+=(build-essential)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v redis-cli >/dev/null || need_apt+=(redis-tools)
command -v redis-benchmark >/dev/null || need_apt+=(redis-tools)
command -v python3 >/dev/null || need_apt+=(python3)
command -v javac >/dev/null || need_apt+=(default-jdk-headless)
command -v mvn >/dev/null || need_apt+=(maven)
# The block adapter's tests drive unmodified NBD clients and ext4.
command -v qemu-img >/dev/null || need_apt+=(qemu-utils)
command -v nbdinfo >/dev/null || need_apt+=(libnbd-bin)
/usr/bin/python3 -c 'import nbd' >/dev/null 2>&1 || need_apt+=(python3-libnbd)
command -v fio >/dev/null || need_apt+=(fio)
command -v mkfs.ext4 >/dev/null || need_apt+=(e2fsprogs)
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v losetup >/dev/null || need_apt+=(mount)
# The file adapter's tests: git and tar inside a mount, pjdfstest (built
# from crates.io below; it needs libacl's headers).
command -v git >/dev/null || need_apt+=(git)
command -v rsync >/dev/null || need_apt+=(rsync)
command -v dbench >/dev/null || need_apt+=(dbench)
command -v stress-ng >/dev/null || need_apt+=(stress-ng)
dpkg -s libacl1-dev >/dev/null 2>&1 || need_apt+=(libacl1-dev acl)
if ! python3 -c 'import redis' >/dev/null 2>&1; then
  need_apt+=(python3-pip python3-venv)
fi
if ! command -v cargo >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  need_apt+=(cargo rustc rustfmt rust-clippy)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}"
fi
export PATH="$HOME/.cargo/bin:$PATH"

# redis-py for tests/py/node_client.py: system-wide if pip allows it,
# otherwise in a venv under target/ (the node tests read LIGHTSTORE_PYTHON).
if ! python3 -c 'import redis' >/dev/null 2>&1; then
  if target/pyenv/bin/python -c 'import redis' >/dev/null 2>&1; then
    export LIGHTSTORE_PYTHON="$PWD/target/pyenv/bin/python"
  elif ! python3 -m pip install -q 'redis>=5' 2>/dev/null; then
    python3 -m venv target/pyenv
    target/pyenv/bin/pip install -q 'redis>=5'
    export LIGHTSTORE_PYTHON="$PWD/target/pyenv/bin/python"
  fi
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# pjdfstest (the POSIX suite's Rust rewrite) and fsx for tests/fs_mount.rs.
TOOLS="$PWD/target/tools"
for tool in pjdfstest fsx; do
  [ -x "$TOOLS/bin/$tool" ] || cargo install "$tool" --locked --root "$TOOLS" -q
done
export PATH="$TOOLS/bin:$PATH"
# pjdfstest switches to the users `nobody` and `tests` (each with its own
# group); a fresh Debian machine has only the first.
if ! id tests >/dev/null 2>&1; then
  $SUDO useradd --system --user-group --no-create-home --shell /usr/sbin/nologin tests
fi

# FUSE over io_uring (Linux 6.14+) is off until this switch is set; the
# mount tests serve through it and through /dev/fuse.
URING=/sys/module/fuse/parameters/enable_uring
[ -e "$URING" ] || $SUDO modprobe fuse 2>/dev/null || true
if [ -e "$URING" ]; then echo Y | $SUDO tee "$URING" >/dev/null || echo "cannot enable FUSE over io_uring" >&2; fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The API docs build without broken or private links.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
cargo test --workspace --locked

# The YCSB binding: its unit tests (the shared ring vectors among them), then
# the real YCSB client against a 3-node cluster of the release binary, with
# every value verified and a read-back pass (CHECK=1 fails on any bad op).
(cd bindings/ycsb && mvn -q -B package)
cargo build --release --locked -p lightstore
RECORDS=10000 OPS=2000 THREADS=8 CHECK=1 DIR="$PWD/target/ycsb-data" \
  OUT="$PWD/target/ycsb-out" BASE_PORT=17601 bench/ycsb
# The fault run: workload A through the binding while node 1 is killed with
# SIGKILL and restarted twice, then a read-back of every record and a wait
# until hinted handoff has caught every node up.
RECORDS=5000 THREADS=8 CHECK=1 FAULTS=1 FAULT_SECONDS=15 DIR="$PWD/target/ycsb-data" \
  OUT="$PWD/target/ycsb-faults-out" BASE_PORT=17651 bench/ycsb
