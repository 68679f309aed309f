#!/usr/bin/env bash
# On the GPU host: run a long benchmark past the 10-minute limit of one device call.
#
#   bench/gpu/background.sh start SCRIPT    # copy the checkout, start SCRIPT in a process session of its own
#   bench/gpu/background.sh wait S DEST     # wait up to S seconds for it; pack its results into DEST/results.tar.gz
#
# Why: a device call may run 10 minutes and its processes end with it, but an engine start costs 70-170 s, so a
# sweep cut into calls restarts engines and leaves each call's tail unused. A process that starts a session of its
# own (setsid) runs on until the machine goes back; the machine stays as long as calls follow each other within
# its idle time, so `wait` calls issued back to back keep one sweep running for the whole device budget.
# The sweep runs from a copy of the checkout: every call re-sends the checkout, and a child process importing
# from it while it is replaced could fail. SCRIPT is run by bash from the copy's root with the vLLM environment
# sourced; it writes its results under $SPECCTL_GPU_HOME/bg/out (the folder `wait` packs).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
HOME_DIR="${SPECCTL_GPU_HOME:-/root/specctl-gpu}"
BG="$HOME_DIR/bg"

start() {
    local script="$1"
    [[ -f "$REPO/$script" ]] || { echo "no such script: $script" >&2; exit 2; }
    if [[ -f "$BG/pid" ]] && kill -0 "$(cat "$BG/pid")" 2>/dev/null; then
        echo "already running (pid $(cat "$BG/pid"))" >&2; exit 1
    fi
    rm -rf "$BG/checkout" "$BG/rc" "$BG/out"
    mkdir -p "$BG/out" "$BG/checkout"
    # the code only: not a virtual environment, caches or the carried wheel parts (links stay links)
    tar -C "$REPO" --exclude=./.git --exclude=./.venv --exclude=./.cache --exclude=./bench/gpu/parts \
        --exclude=./bench/gpu/wheels -cf - . | tar -C "$BG/checkout" -xf -
    # the environment install.sh wrote for the installed wheel set (SPECCTL_GPU_SET: vllm026 or vllm034)
    local set="${SPECCTL_GPU_SET:-vllm026}" env_file="$HOME_DIR/env.sh"
    [[ "$set" == vllm026 ]] || env_file="$HOME_DIR/env-$set.sh"
    [[ -f "$env_file" ]] || { echo "no $env_file: run bench/gpu/install.sh install $set first" >&2; exit 1; }
    sed -i "s#^export PYTHONPATH=\"[^:]*:#export PYTHONPATH=\"$BG/checkout:#" "$env_file"
    setsid nohup bash -c "cd '$BG/checkout' && source '$env_file' && export SPECCTL_BG_OUT='$BG/out' \
        && bash '$script'; echo \$? > '$BG/rc'" > "$BG/out/background.log" 2>&1 < /dev/null &
    echo $! > "$BG/pid"
    echo "started $script (pid $(cat "$BG/pid")), log $BG/out/background.log"
}

pack() {  # into a temporary name first: a call cut off mid-pack still returns the previous, whole archive
    # The job writes while this reads: a file that grows, appears or vanishes meanwhile is packed as read (GNU
    # tar then exits 1, "file changed as we read it"; the archive is whole). Exit 2 and above are real failures.
    local rc=0
    tar -czf "$1/results.tar.gz.part" --ignore-failed-read --warning=no-file-changed --warning=no-file-removed \
        -C "$BG/out" . || rc=$?
    ((rc <= 1)) || return "$rc"
    mv -f "$1/results.tar.gz.part" "$1/results.tar.gz"
}

wait_for() {
    # Packs every minute as well as at the end: a call cut off at the session's last device seconds (its limit
    # is then shorter than asked) still brings back what $OUT held, and session 7 lost 8 minutes of rows so.
    local seconds="$1" dest="$2" t0=$SECONDS last=$SECONDS
    pack "$dest"
    while [[ ! -f "$BG/rc" ]] && ((SECONDS - t0 < seconds)); do
        sleep 5
        if ((SECONDS - last >= 60)); then pack "$dest"; last=$SECONDS; fi
    done
    pack "$dest"
    tail -n 40 "$BG/out/background.log"
    if [[ -f "$BG/rc" ]]; then echo "finished: exit $(cat "$BG/rc")"; else echo "still running"; fi
}

case "${1:-}" in
    start) start "${2:?script}" ;;
    wait) wait_for "${2:?seconds}" "${3:?dest}" ;;
    *) echo "usage: $0 start SCRIPT | wait SECONDS DEST" >&2; exit 2 ;;
esac
