#!/usr/bin/env bash
# bench/gpu/background.sh's test job that outlasts the call waiting on it: one row now, then a long sleep.
echo "row 1" > "$SPECCTL_BG_OUT/rows.jsonl"
sleep 120
