"""The verl drift check (`rlhf-exporter verl-drift`): what a verl release, a fork or a log has
that the project does not know.

- `source`: reads a verl tree (installed, a wheel, an sdist or a checkout) with `ast` and lists
  its timers, `perf/mfu/*` stages, the file logger's path variables and record format, the
  rollout servers' actor name formats and the keys it writes;
- `check`: compares them (or a log's keys) with the decision table, the metric catalog's keys
  and Ray discovery, and reports every one the project does not know.
"""
