#!/usr/bin/env bash
# bench/gpu/background.sh's test job: record where and with what it ran.
echo "cwd=$PWD" > "$SPECCTL_BG_OUT/seen.txt"
echo "pythonpath=$PYTHONPATH" >> "$SPECCTL_BG_OUT/seen.txt"
