#!/bin/sh
# A stand-in `nvidia-smi` that replays a recorded real host (see SOURCES.md).
# RECORD is the directory holding q.txt (and optionally topo.txt).
RECORD="$(dirname "$0")"
case "$*" in
  "-q") cat "$RECORD/q.txt" ;;
  "topo -m")
    if [ -f "$RECORD/topo.txt" ]; then cat "$RECORD/topo.txt"; else
      echo "recorded host has no topo -m output" >&2; exit 3; fi ;;
  *) echo "stand-in nvidia-smi: no recording for: $*" >&2; exit 2 ;;
esac
