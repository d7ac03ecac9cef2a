"""Host agent that answers other agents' operations, one after another, in one
python3 kept on one SSH channel for a whole run (k26ops/transport/agenthub.py is its one caller).

Why: every agents.run is an SSH exec channel and a python3 start (a python3
start alone is about 12 ms of a lab host's CPU). A converged deploy asks the ownership, gather and engine
agents in turn, each question waiting for what the answer before it allowed
(the lock, the facts, the release id); through the hub they are one start.

Protocol: the agents.run request, one per line on stdin, plus "agent" (its
name) and, the first time that agent is asked, "source" (its file's text: run
once here under the name k26ops_agent_NAME, so its `__main__` part does not
run). One answer per line on stdout: ANSWER + the agent's JSON answer, or
ANSWER + {"hub_error": the exception's last line} (the hub goes on). An agent
with a `handle(request)` function is called through it (the engine's takes its
api_key out first); the others' op_<op>(request). EOF on stdin: exit.
"""

import json
import sys

ANSWER = "k26ops-hub-answer "


def answer(agents, line):
    req = json.loads(line)
    name = req.pop("agent")
    source = req.pop("source", None)
    if source is not None:
        ns = {"__name__": "k26ops_agent_" + name, "__builtins__": __builtins__}
        exec(compile(source, name + ".py", "exec"), ns)
        agents[name] = ns
    ns = agents[name]
    if "handle" in ns:
        return ns["handle"](req)
    return ns["op_" + req.pop("op")](req)


def last_line(exc):
    """The last line traceback.format_exc() would print, without importing traceback
    (its imports, linecache and tokenize, cost every hub start)."""
    kind = type(exc)
    name = (
        kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else kind.__module__ + "." + kind.__qualname__
    )
    return ("%s: %s" % (name, exc) if str(exc) else name).strip().splitlines()[-1]


def main():
    agents = {}
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        try:
            text = json.dumps(answer(agents, line))
        except Exception as exc:  # the hub's caller reports it as that agent's failure
            text = json.dumps({"hub_error": last_line(exc)})
        sys.stdout.write("\n" + ANSWER + text + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
