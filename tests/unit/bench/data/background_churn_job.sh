#!/usr/bin/env bash
# bench/gpu/background.sh's test job: keeps writing while `wait` packs (a file that grows, files that come and go).
for i in $(seq 1 400); do
    head -c 4096 /dev/zero >> "$SPECCTL_BG_OUT/growing.bin"
    echo "$i" > "$SPECCTL_BG_OUT/tmp-$i.txt"
    rm -f "$SPECCTL_BG_OUT/tmp-$((i - 1)).txt"
    sleep 0.01
done
echo done > "$SPECCTL_BG_OUT/seen.txt"
