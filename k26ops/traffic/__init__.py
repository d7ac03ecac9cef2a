"""Traffic around the engine: the gateways that route to a host and the drain that takes it
out of rotation before its engine stops (docs/how-to/gateway-and-drain.md).

- `gateway`: a client of the SGLang Model Gateway's worker API (sglang-router 0.3.2).
- `drain`: the inventory's traffic settings and the one drain path every command that
  stops a serving engine goes through.
"""
