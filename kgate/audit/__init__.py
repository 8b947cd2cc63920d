"""`kgate audit`: judge a whole corpus of KernelBench-format candidates with the gates and, beside
them, the field's standard test. Modules: `evaluate` (one pair, compile and evaluation stages),
`worker` (the process that runs one stage), `scheduler` (local devices), `ray_backend` (a Ray
cluster), `results` (the resumable results file, shards), `report` (summary, markdown, plots)."""
