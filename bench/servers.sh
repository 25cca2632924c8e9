# bench/servers.sh — sourced by bench scripts that start servers in the
# background: `PIDS` holds them, `stop_all` ends them (SIGTERM, then
# SIGKILL after 30 s), `wait_socket PATH` waits up to 30 s for a Unix
# socket (the caller defines `die MESSAGE`).
PIDS=()
stop_all() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    PIDS=()
}
wait_socket() { for _ in $(seq 1 300); do [ -S "$1" ] && return 0; sleep 0.1; done; die "no socket $1"; }
