"""Host agents: the Python that k26ops runs on a host, one real file each.

Each module here runs under the host's own `python3` (standard library only),
shipped with the command (`python3 -S -c <source>`): nothing is installed on the
host and nothing is left behind. One protocol for all of them: one JSON
request on stdin ({"op": NAME, ...}), one JSON answer as the last line of
stdout. k26ops.transport.agents.run is the one caller; the modules are linted and unit-tested here
like the rest of k26ops (tests/transport/test_agents.py), never imported at run time.

Host Python: 3.10 or newer (k26ops.transport.agents.OLDEST_PYTHON). The oldest supported host is
Ubuntu 22.04 (python3 3.10); Debian 12, the lab's, has 3.11 and Ubuntu 24.04
3.12. tests/transport/test_agents.py parses every agent with that grammar and checks
that it imports only standard-library modules.

The agents: engine (the engine's unit, health, smoke, logs), gather (fact
commands), loadgen (engine bench), ownership (what k26ops may delete),
baseline (snapshot, rollback, drift), journal (diagnose service), probe
(diagnose probe), wheelfetch (wheels from a relay, hash-checked), store (the
release store: uv's binary, store gc), hub (several agents' operations in one
python3 kept on one channel for a run: k26ops/transport/agenthub.py).
"""
