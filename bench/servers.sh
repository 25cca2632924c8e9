# bench/servers.sh — sourced by bench scripts that start servers in the
# background: `PIDS` holds them, `stop_all` ends them (SIGTERM, then
# SIGKILL after 30 s), `wait_socket PATH` waits up to 30 s for a Unix
# socket (the caller defines `die MESSAGE`), `cpu_ticks PID...` the CPU
# the processes spent, `stat_fields PID` a process's /proc/PID/stat.
# `lock_dir DIR` holds DIR.lock (left in place) for the rest of the script, or dies when
# another bench holds it (two runs on one DIR removed each other's files).
lock_dir() {
    exec 9>"$1.lock"
    flock -n 9 || die "another benchmark is using $1 (its lock $1.lock is held)"
}
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
# The fields of /proc/PID/stat after the process's name (field 3 is $1),
# which may hold spaces.
stat_fields() { local f; f=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; echo "${f##*) }"; }
cpu_ticks() { # PIDs... -> utime+stime of all (their ended threads too), in ticks
    local t=0 p f
    for p in "$@"; do
        f=$(stat_fields "$p") || continue
        t=$((t + $(echo "$f" | awk '{print $12 + $13}')))
    done
    echo "$t"
}
