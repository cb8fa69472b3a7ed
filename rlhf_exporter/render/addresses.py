"""The addresses the rendered files publish: the dashboards' uids and the files they are
written to. Rules link to the job dashboard (an alert's `dashboard_url`) and dashboards link
to each other, so both read them here, and neither imports the other for them."""

from __future__ import annotations

JOB_UID = "rlhf-job"
FLEET_UID = "rlhf-fleet"
JOB_PATH = "grafana/rlhf-job.json"
FLEET_PATH = "grafana/rlhf-fleet.json"
