#!/bin/sh
# A stand-in `nvidia-smi` that replays a recorded real host (see SOURCES.md).
# RECORD is the directory holding q.txt (and optionally topo.txt, csv.txt). A record without
# csv.txt answers the compute_cap query as a driver without that field does.
RECORD="$(dirname "$0")"
case "$*" in
  "-q") cat "$RECORD/q.txt" ;;
  "topo -m")
    if [ -f "$RECORD/topo.txt" ]; then cat "$RECORD/topo.txt"; else
      echo "recorded host has no topo -m output" >&2; exit 3; fi ;;
  "--query-gpu=name,compute_cap,driver_version,pci.bus_id,memory.total --format=csv")
    if [ -f "$RECORD/csv.txt" ]; then cat "$RECORD/csv.txt"; else
      echo 'Field "compute_cap" is not a valid field to query.' >&2; exit 2; fi ;;
  *) echo "stand-in nvidia-smi: no recording for: $*" >&2; exit 2 ;;
esac
