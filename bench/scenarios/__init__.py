"""The benchmark's scenarios, one module each, named for what it measures; each exposes one
function `(args, workdir, out)` that appends its rows to `out["scenario_<n>"]` and saves the
results JSON after each row. bench/run.py runs them in its order; bench/report.py prints them
by number.

 1, 2  seed_cycle.py      seed_cycle_and_floor   seed cycle throughput, then the RQ floor
                          (rq_floor.py) on the same Redis
 3     parked_memory.py   parked_memory          the cost of a pause: memory per parked session,
                                                 resume latency at P
 4     scaling.py         scaling                dispatchers x worker processes
 5     langgraph_peer.py  langgraph_peer         the same flow in LangGraph, SQLite and Postgres
 6     sweeps.py          sweeps_with_backlog    the dispatcher's sweeps with jobs queued
 7     inbox_listing.py   inbox_listing          a page of `parley interrupts` as they grow
 8     soak.py            soak                   sessions through their whole life: memory after
 9     session_list.py    session_list           a page of `parley sessions` as they grow
10     flood.py           flood_fairness         one session flooded: another's delay
11     shards.py          shards                 the seed cycle on 1 shard and on 2
12     inbox_page.py      inbox_page             `parley inbox`'s first page, as HTTP requests
13     long_sessions.py   long_sessions          a transition and `parley show` on long sessions

Where a scenario's measurement is larger than its rows, it lives beside this package, in the
bench/ module the scenario's docstring names (bench/sweep.py, bench/flood.py, ...).
"""
