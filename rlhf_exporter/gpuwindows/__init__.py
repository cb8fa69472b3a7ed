"""The GPU-window join's two halves, side by side (issue 17).

- `board`: the head's side. Jobs post each classified step's timeline to the `WindowBoard`;
  the NVML source joins it to this node's GPUs; `WindowsApi` serves it to worker sidecars.
- `remote`: a worker sidecar's source that fetches the head's windows into its own board.
"""
