"""One verl job, in the order a record goes through it (each module imports only those
before it, never one after):

- `limits`: the bounds on what a job keeps, each under one name;
- `record_keys`: the verl record keys a job reads beyond the decision table's timers;
- `cleaning`: where a record is parsed into what a job keeps (hostile input stopped, counted);
- `counts`: what its classified steps add up to, and the engines' evidence over them;
- `end_signals`: how its end is known (Ray, a marker, a file, its total steps);
- `packed_history`: its last steps for the job view, packed;
- `placement`: where its steps go in time (the window board) and meet the engines' evidence;
- `series`: where its families are exposed (`EXTRA_SERIES`: which verl key feeds which metric);
- `summary`: what the landing page and the job view show of it;
- `state`: `Job`, which composes all of the above;
- `windows_wire`: the window board's JSON format and the head's `GET /api/v1/windows`.
"""
