"""The join: where one verl job meets what the other sources measured over its steps.

It sits below the sources and above the pure logic (rlhf_exporter/diagnosis/): no HTTP, no
auth, no source of its own. `ports` declares what a `Job` and the sources are handed (typed
Protocols, so nothing crosses as `Any`); `board` keeps the jobs' recent step windows and
joins them to the GPUs' samples; `names` says which source owns a job's name.
"""
